"""The site's HTTP client of the inference server (`inference/`, or any OpenAI-compatible
server): a backend chosen by dotted path in settings.INFERENCE_CLIENT, like Channels'
layers. Every backend streams the same items (base.py); http.py talks to real servers,
fake.py echoes in-process for tests."""

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from chat.inference_client.base import (
    ChatRequest,
    Delta,
    Finish,
    InferenceClient,
    InferenceError,
    Progress,
)

__all__ = [
    "ChatRequest",
    "Delta",
    "Finish",
    "InferenceClient",
    "InferenceError",
    "Progress",
    "get_client",
    "reset_client",
]


@cache
def _client(path: str) -> InferenceClient:
    return import_string(path)()


def get_client() -> InferenceClient:
    return _client(settings.INFERENCE_CLIENT)


def reset_client() -> None:
    """Forget the built clients, so the next get_client() reads settings again."""
    _client.cache_clear()
