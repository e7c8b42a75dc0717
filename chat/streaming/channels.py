"""Naming: one event channel per conversation, and the URL the page subscribes to."""

import uuid

PREFIX = "conversation-"
# The ASGI route of the event stream (tokenstream_site/asgi.py) and the URL given to the
# page (the conversation JSON's `events_url`) come from this one pattern.
EVENTS_ROUTE = "events/conversations/<uuid:conversation_id>/"


def channel_for(conversation_id) -> str:
    return f"{PREFIX}{conversation_id}"


def conversation_id_from_channel(channel: str) -> uuid.UUID | None:
    if not channel.startswith(PREFIX):
        return None
    try:
        return uuid.UUID(channel[len(PREFIX) :])
    except ValueError:
        return None


def events_url(conversation_id) -> str:
    return "/" + EVENTS_ROUTE.replace("<uuid:conversation_id>", str(conversation_id))
