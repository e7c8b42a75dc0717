"""The models the inference servers offer. A conversation's `model` is sent upstream as
is, so only these are accepted; the list is asked for at most every
INFERENCE_MODELS_CACHE_SECONDS (it changes when an operator swaps a model, not per request)."""

from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.cache import cache

from chat.inference_client import get_client

CACHE_KEY = "inference:model-ids"


def model_ids() -> list[str]:
    """The ids the servers list; empty when none answered (not remembered, so the next
    request asks again)."""
    ids = cache.get(CACHE_KEY)
    if ids is None:
        models = async_to_sync(get_client().list_models)()
        ids = [str(m["id"]) for m in models if isinstance(m, dict) and m.get("id")]
        if ids:
            cache.set(CACHE_KEY, ids, settings.INFERENCE_MODELS_CACHE_SECONDS)
    return ids
