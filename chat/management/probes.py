"""Shared by the operator commands: ask an inference server whether it is up, and say why
not in words an operator can act on."""

import logging
from dataclasses import dataclass

import httpx
from django.conf import settings

PROBE_TIMEOUT = 5.0


@dataclass(frozen=True)
class ReadyState:
    reachable: bool
    ready: bool
    status: str  # "ready", "loading", "failed", or why it could not be asked
    model: str = ""
    error: str = ""


def _headers() -> dict:
    if settings.INFERENCE_API_KEY:
        return {"Authorization": f"Bearer {settings.INFERENCE_API_KEY}"}
    return {}


def get(url: str, path: str) -> httpx.Response:
    return httpx.get(f"{url.rstrip('/')}{path}", headers=_headers(), timeout=PROBE_TIMEOUT)


def describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer in {PROBE_TIMEOUT:.0f} s"
    if isinstance(exc, httpx.ConnectError) and "refused" in str(exc).lower():
        return "connection refused"
    return str(exc) or type(exc).__name__


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def ready_state(url: str) -> ReadyState:
    try:
        response = get(url, "/ready")
    except httpx.HTTPError as exc:
        return ReadyState(reachable=False, ready=False, status=describe(exc))
    body = _json(response)
    ready = response.status_code == 200
    # vLLM and other servers have no /ready body: a 200 is all they say.
    status = body.get("status") or ("ready" if ready else f"HTTP {response.status_code}")
    return ReadyState(
        reachable=True,
        ready=ready,
        status=status,
        model=body.get("model") or "",
        error=body.get("error") or "",
    )


def unreachable_sentence(url: str) -> str:
    return f"The inference server at {url} is not reachable: is `python -m inference` running?"


def quiet_http_logs() -> None:
    """httpx logs every request at INFO, which would bury the commands' own lines."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
