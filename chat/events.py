"""The browser event contract (DESIGN.md): what the page receives on a conversation's channel."""

from asgiref.sync import sync_to_async
from django.conf import settings
from django_eventstream import send_event


def channel_for(conversation_id) -> str:
    return f"conversation-{conversation_id}"


def _local_only() -> bool:
    # Appending to the in-memory log and waking local listeners takes microseconds: do it on
    # the event loop. Anything that talks to a server (Redis) goes to a thread.
    return (
        settings.EVENTSTREAM_STORAGE_CLASS == "chat.eventlog.MemoryEventStorage"
        and not hasattr(settings, "EVENTSTREAM_REDIS")
    )


async def apublish(conversation_id, event_type: str, data: dict) -> None:
    channel = channel_for(conversation_id)
    if _local_only():
        send_event(channel, event_type, data)
    else:
        await sync_to_async(send_event, thread_sensitive=False)(channel, event_type, data)


def publish(conversation_id, event_type: str, data: dict) -> None:
    send_event(channel_for(conversation_id), event_type, data)


def message_error_data(message_id, error: str, retryable: bool) -> dict:
    return {"message_id": str(message_id), "error": error, "retryable": retryable}

