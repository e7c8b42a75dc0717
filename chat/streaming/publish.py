"""Publishing a conversation's events (the browser event contract, docs/events.md).

On one process (the in-memory log, no Redis) an event is appended and handed to the local
subscriptions on the event loop itself; at 4,000 tokens/s what django-eventstream's
`send_event` does besides was a large part of the site's CPU. With Redis, events go to
this loop's publisher (chat/streaming/delivery.py), which sends a loop turn's events to the
shared log and every process in one round trip.

Which of the two applies is read from the settings once, not per event (a missing
setting's lookup through Django's lazy settings raised and caught AttributeError for every
token), and read again whenever a test changes a setting.
"""

import json
import math
from json.encoder import encode_basestring_ascii

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from chat.streaming import delivery, eventstream
from chat.streaming.channels import channel_for

MEMORY_LOG = "chat.streaming.memory_log.MemoryEventStorage"

_local: bool | None = None
_storage = None


def local_delivery() -> bool:
    """One process: events go to the in-memory log and local subscriptions, no Redis."""
    global _local
    if _local is None:
        _local = settings.EVENTSTREAM_STORAGE_CLASS == MEMORY_LOG
    return _local


@receiver(setting_changed)
def _settings_changed(**kwargs) -> None:
    global _local, _storage
    _local = _storage = None
    delivery.forget_publisher()


def publish_on_loop(conversation_id, event_type: str, data: dict) -> None:
    """Only from the event loop's thread, and only with local delivery."""
    publish_encoded(channel_for(conversation_id), event_type, eventstream.encode(data))


def publish_encoded(channel: str, event_type: str, data: str) -> None:
    """publish_on_loop for data already JSON (a token event is built as text)."""
    global _storage
    if _storage is None:
        # The in-memory log keeps its state in its module: one instance serves every thread.
        _storage = eventstream.storage()
    eventstream.append_and_notify(_storage, channel, event_type, data)


async def apublish(conversation_id, event_type: str, data: dict) -> None:
    await apublish_encoded(channel_for(conversation_id), event_type, eventstream.encode(data))


async def apublish_encoded(channel: str, event_type: str, data: str) -> None:
    """apublish for data already JSON (a token event is built as text)."""
    if local_delivery():
        publish_encoded(channel, event_type, data)
    else:
        await delivery.publisher().apublish(channel, event_type, data)


def publish_later(channel: str, event_type: str, data: str, done) -> None:
    """On the loop, with Redis: queue the event for this loop turn's batch;
    `done(event, error)` follows once it is in the log (delivery.RedisPublisher.publish)."""
    delivery.publisher().publish(channel, event_type, data, done)


def token_data_prefix(message_id) -> str:
    """The start of every `token` event's data of one reply, made once per reply."""
    return f'{{"message_id": {json.dumps(str(message_id))}, "seq": '


def token_data(prefix: str, seq: int, text: str, produced_at: float | None = None) -> str:
    """What json.dumps({"message_id", "seq", "text"[, "produced_at"]}) writes, built
    without encoding the same message id and keys for every token."""
    stamp = "" if produced_at is None else f', "produced_at": {_number(produced_at)}'
    # json.dumps(str) is this function, reached through two Python calls per token.
    return f'{prefix}{seq}, "text": {encode_basestring_ascii(text)}{stamp}}}'


def _number(value) -> str:
    """json.dumps' text for a number: repr, as json writes a finite float or an int."""
    if type(value) in (float, int) and math.isfinite(value):
        return repr(value)
    return json.dumps(value)


def message_error_data(message_id, error: str, retryable: bool) -> dict:
    return {"message_id": str(message_id), "error": error, "retryable": retryable}
