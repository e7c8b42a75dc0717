"""Sign-in with a brake on password guessing that a stranger cannot turn against the
account's owner.

Guesses are counted before the password is checked (chat/throttle.py), per account *and*
where they come from:

- per account and address (or per account and trusted device): LOGIN_MAX_FAILURES free
  failures, then one guess per delay, the delay doubling from LOGIN_DELAY_SECONDS up to
  LOGIN_LOCKOUT_SECONDS. A guesser elsewhere never delays the owner, who has another address
  or device;
- per address, any account (LOGIN_MAX_FAILURES_PER_ADDRESS), against one machine trying
  many names; and per account, any address (LOGIN_MAX_FAILURES_PER_ACCOUNT), against many
  machines trying one name.

The two wide limits would let a stranger lock out everyone behind a shared address, or an
account everywhere, so they do not apply to a trusted device: a browser where that account
signed in before (a signed cookie set at each sign-in) or one signed in as it now. Such a
device only has its own per-device delays.
"""

import functools
import logging
import math
import secrets

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.core import signing
from django.core.cache import cache
from django.shortcuts import render

from chat import throttle
from chat.client_address import client_address, client_key

logger = logging.getLogger(__name__)

DEVICE_COOKIE = "tokenstream_device"
DEVICE_SALT = "chat.auth.device"
DEVICE_MAX_AGE = 365 * 24 * 3600
DEVICE_ACCOUNTS = 5  # accounts one browser is trusted for (a shared family computer)
# How long the growing delays of one account and address remember earlier delays.
STRIKES_MEMORY = 24 * 3600
PAIR_REFUSAL = "Too many failed sign-ins. Wait {wait} and try again."
WIDE_ADVICE = "Sign in from a browser you signed in with before, or wait up to {wait}."


def _device(request) -> dict | None:
    try:
        data = signing.loads(
            request.COOKIES.get(DEVICE_COOKIE, ""), salt=DEVICE_SALT, max_age=DEVICE_MAX_AGE
        )
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("accounts"), list):
        return None
    return data


def _account_key(username: str) -> str:
    return throttle.digest(username.strip().lower()[:150])


class SignInAttempt:
    """One POST to a sign-in form: admitted (and counted) or refused, then settled."""

    def __init__(self, request):
        self.request = request
        self.account = _account_key(request.POST.get("username") or "")
        device = _device(request)
        user = request.user
        self.trusted = bool(device and self.account in device["accounts"]) or (
            user.is_authenticated and _account_key(user.get_username()) == self.account
        )
        self.device_id = device["id"] if device else secrets.token_hex(16)
        address = throttle.digest(client_key(client_address(request)))
        where = f"device:{self.device_id}" if device and self.trusted else f"address:{address}"
        self.pair = f"signin:{where}:{self.account}"
        self.wide = (
            []
            if self.trusted
            else [
                (
                    f"signin:address:{address}",
                    settings.LOGIN_MAX_FAILURES_PER_ADDRESS,
                    "Too many failed sign-ins from your network. " + WIDE_ADVICE,
                ),
                (
                    f"signin:account:{self.account}",
                    settings.LOGIN_MAX_FAILURES_PER_ACCOUNT,
                    "Too many failed sign-ins to this account. " + WIDE_ADVICE,
                ),
            ]
        )
        self.counted: list[str] = []
        self.pair_count = 0

    def admit(self) -> tuple[str, float] | None:
        """None when the password may be checked, else (message, seconds to wait)."""
        wait = throttle.locked_for(f"{self.pair}:lock")
        if wait:
            return PAIR_REFUSAL, wait
        window = settings.LOGIN_LOCKOUT_SECONDS
        self.pair_count = throttle.hit(self.pair, window)
        self.counted.append(self.pair)
        if self.pair_count > settings.LOGIN_MAX_FAILURES:
            self._uncount()
            return PAIR_REFUSAL, settings.LOGIN_DELAY_SECONDS
        for key, limit, why in self.wide:
            self.counted.append(key)
            if throttle.hit(key, window) > limit:
                self._uncount()
                return why, window
        return None

    def _uncount(self) -> None:
        for key in self.counted:
            throttle.unhit(key)
        self.counted = []

    def succeeded(self, response) -> None:
        """The right password is no failure: give back its counts, forget the delays."""
        self._uncount()
        cache.delete_many([self.pair, f"{self.pair}:lock", f"{self.pair}:strikes"])
        self._trust_device(response)

    def failed(self) -> None:
        if self.pair_count < settings.LOGIN_MAX_FAILURES:
            return
        strikes = throttle.hit(f"{self.pair}:strikes", STRIKES_MEMORY)
        delay = min(
            settings.LOGIN_DELAY_SECONDS * 2 ** (strikes - 1), settings.LOGIN_LOCKOUT_SECONDS
        )
        throttle.lock(f"{self.pair}:lock", delay)
        # One more guess after the delay, not a fresh allowance.
        cache.set(self.pair, settings.LOGIN_MAX_FAILURES - 1, settings.LOGIN_LOCKOUT_SECONDS)

    def _trust_device(self, response) -> None:
        device = _device(self.request) or {"id": self.device_id, "accounts": []}
        accounts = [self.account] + [a for a in device["accounts"] if a != self.account]
        value = signing.dumps(
            {"id": device["id"], "accounts": accounts[:DEVICE_ACCOUNTS]}, salt=DEVICE_SALT
        )
        response.set_cookie(
            DEVICE_COOKIE,
            value,
            max_age=DEVICE_MAX_AGE,
            httponly=True,
            samesite="Lax",
            secure=settings.SESSION_COOKIE_SECURE,
        )


def _wait_text(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, math.ceil(seconds))} seconds"
    return f"{math.ceil(seconds / 60)} minutes"


def _refused(request, why: str, seconds: float):
    message = why.format(wait=_wait_text(seconds))
    context = {"form": {"non_field_errors": [message]}, "next": request.POST.get("next", "")}
    response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(max(1, math.ceil(seconds)))
    return response


def throttled_sign_in(view):
    """Wraps a sign-in view (ours and the admin's): guesses are counted before the
    password check, and the outcome settles the count."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method != "POST":
            return view(request, *args, **kwargs)
        attempt = SignInAttempt(request)
        refusal = attempt.admit()
        if refusal is not None:
            # The address only: a username field sometimes holds a mistyped password.
            logger.warning(
                "sign-in refused, client %s: %s", client_address(request), refusal[0].split(".")[0]
            )
            return _refused(request, *refusal)
        response = view(request, *args, **kwargs)
        user = request.user
        signed_in = response.status_code in (301, 302, 303) and user.is_authenticated
        if signed_in and _account_key(user.get_username()) == attempt.account:
            attempt.succeeded(response)
        else:
            attempt.failed()
        return response

    return wrapper


sign_in = throttled_sign_in(LoginView.as_view())
