"""The browser event contract (DESIGN.md): what the page receives on a conversation's channel.

On one process (the in-memory log, no Redis) an event is published on the event loop itself:
appended to the log and handed to the local listeners, waking them directly. This skips what
django-eventstream's `send_event` does for every event besides (a GRIP proxy publish that
nothing receives here, and a cross-thread wake-up through the loop's self-pipe), which at
4,000 tokens/s was a large part of the site's CPU. With Redis, `send_event` runs in a
thread: it makes network calls.
"""

import json

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django_eventstream import send_event
from django_eventstream.utils import get_storage
from django_eventstream.views import get_listener_manager

# Events a listener may have queued before it must re-read the log (django-eventstream's
# own limit is 10; the log makes overflow harmless, this only makes it rarer).
LISTENER_QUEUE_LIMIT = 1000


def channel_for(conversation_id) -> str:
    return f"conversation-{conversation_id}"


def local_delivery() -> bool:
    """One process: events go to the in-memory log and local listeners, no Redis."""
    return (
        settings.EVENTSTREAM_STORAGE_CLASS == "chat.eventlog.MemoryEventStorage"
        and not hasattr(settings, "EVENTSTREAM_REDIS")
    )


def _publish_on_loop(channel: str, event_type: str, data: dict) -> None:
    """Only from the event loop's thread, where every listener waits."""
    event = get_storage().append_event(
        channel, event_type, json.dumps(data, cls=DjangoJSONEncoder)
    )
    manager = get_listener_manager()
    with manager.lock:
        for listener in manager.listeners_by_channel.get(channel, ()):
            queued = listener.channel_items.setdefault(channel, [])
            if len(queued) < LISTENER_QUEUE_LIMIT:
                queued.append(event)
            else:
                listener.overflow = True
            listener.aevent.set()


async def apublish(conversation_id, event_type: str, data: dict) -> None:
    channel = channel_for(conversation_id)
    if local_delivery():
        _publish_on_loop(channel, event_type, data)
    else:
        await sync_to_async(send_event, thread_sensitive=False)(channel, event_type, data)


def message_error_data(message_id, error: str, retryable: bool) -> dict:
    return {"message_id": str(message_id), "error": error, "retryable": retryable}
