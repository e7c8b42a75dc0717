"""Personal API keys for the site's OpenAI-compatible /v1 API.

A key is `ts-` followed by 43 URL-safe characters (32 random bytes). The database keeps its
SHA-256 and its first characters (to recognise it in a list), never the key itself: it is
shown once, when created. A key opens /v1 only: never the page, the JSON API or the admin.
"""

import datetime
import hashlib
import secrets
import uuid

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from chat.models import ApiKey
from chat.services import ServiceError

KEY_PREFIX = "ts-"
SHOWN_CHARS = 8  # of the random part, kept as the key's visible prefix
# Writing last_used_at on every call would add a write to each request; a minute is
# precise enough to tell a key in use from a forgotten one.
LAST_USED_RESOLUTION = datetime.timedelta(minutes=1)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


# --- reads ---------------------------------------------------------------------------


def api_keys_of(*, user) -> QuerySet[ApiKey]:
    """The user's keys that still work, newest first."""
    return ApiKey.objects.filter(user=user, revoked_at__isnull=True).order_by("-created_at")


def api_key_get(*, user, key_id: uuid.UUID) -> ApiKey:
    """The user's own working key; ApiKey.DoesNotExist for anyone else's or a revoked one."""
    return ApiKey.objects.get(pk=key_id, user=user, revoked_at__isnull=True)


def user_for_secret(secret: str):
    """The active user a working key belongs to, or None. Marks the key used."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    key = (
        ApiKey.objects.select_related("user")
        .filter(key_hash=hash_secret(secret), revoked_at__isnull=True)
        .first()
    )
    if key is None or not key.user.is_active:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key.user


# --- writes --------------------------------------------------------------------------


def api_key_create(*, user, name: str) -> tuple[ApiKey, str]:
    """A new key and its secret, which the caller shows once and forgets."""
    if api_keys_of(user=user).count() >= settings.CHAT_MAX_API_KEYS_PER_USER:
        raise ServiceError(
            f"You already have {settings.CHAT_MAX_API_KEYS_PER_USER} API keys. "
            "Revoke one you no longer use first."
        )
    secret = new_secret()
    key = ApiKey.objects.create(
        user=user,
        name=name or "API key",
        prefix=secret[: len(KEY_PREFIX) + SHOWN_CHARS],
        key_hash=hash_secret(secret),
    )
    return key, secret


def api_key_revoke(*, key: ApiKey) -> None:
    """The key stops working at once; the row stays, so staff can see it existed."""
    ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
