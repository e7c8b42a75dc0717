"""Publishing a conversation's events (the browser event contract, docs/events.md).

On one process (the in-memory log, no Redis) an event is appended and handed to the local
subscriptions on the event loop itself; at 4,000 tokens/s what `send_event` does besides
was a large part of the site's CPU. With Redis, `send_event` runs in a thread: it makes
network calls (the shared log, then pub/sub to every process).
"""

from asgiref.sync import sync_to_async
from django.conf import settings

from chat.streaming import eventstream
from chat.streaming.channels import channel_for

MEMORY_LOG = "chat.streaming.memory_log.MemoryEventStorage"


def local_delivery() -> bool:
    """One process: events go to the in-memory log and local subscriptions, no Redis."""
    return settings.EVENTSTREAM_STORAGE_CLASS == MEMORY_LOG and not hasattr(
        settings, "EVENTSTREAM_REDIS"
    )


def publish_on_loop(conversation_id, event_type: str, data: dict) -> None:
    """Only from the event loop's thread, and only with local delivery."""
    eventstream.append_and_notify(channel_for(conversation_id), event_type, data)


async def apublish(conversation_id, event_type: str, data: dict) -> None:
    if local_delivery():
        publish_on_loop(conversation_id, event_type, data)
    else:
        channel = channel_for(conversation_id)
        await sync_to_async(eventstream.send_event, thread_sensitive=False)(
            channel, event_type, data
        )


def message_error_data(message_id, error: str, retryable: bool) -> dict:
    return {"message_id": str(message_id), "error": error, "retryable": retryable}
