"""The event log behind django-eventstream, and who may read a conversation's channel.

django-eventstream without storage drops tokens past 10 queued events, and its
DjangoModelStorage costs a database transaction per event. This log keeps each channel's
recent events in process memory: appending is a lock and a list append, and a listener that
overflowed re-reads what it missed from here. Ids start at the microsecond clock when a
channel is first seen in this process, so an id from before a restart is never mistaken
for a new one: it is unknown, the client gets `stream-reset`, and the page reloads the
message from the JSON API (whose `next_seq` tells it which token events it already has).
"""

import threading
import time
import uuid

from django.conf import settings
from django_eventstream.channelmanager import ChannelManagerBase
from django_eventstream.event import Event
from django_eventstream.storage import EventDoesNotExist, StorageBase

CHANNEL_PREFIX = "conversation-"


class _ChannelLog:
    __slots__ = ("first_id", "events", "last_used")

    def __init__(self) -> None:
        # first_id is the id the first kept event has (or would have).
        self.first_id = time.time_ns() // 1000 + 1
        self.events: list[Event] = []
        self.last_used = time.monotonic()

    @property
    def current_id(self) -> int:
        return self.first_id + len(self.events) - 1


# Module-level state: django-eventstream keeps one storage instance per thread, but every
# thread of the process must see the same log.
_lock = threading.Lock()
_channels: dict[str, _ChannelLog] = {}


def _log_for(channel: str) -> _ChannelLog:
    log = _channels.get(channel)
    if log is None:
        log = _channels[channel] = _ChannelLog()
    log.last_used = time.monotonic()
    return log


class MemoryEventStorage(StorageBase):
    def append_event(self, channel, event_type, data):
        limit = settings.EVENTLOG_MAX_EVENTS_PER_CHANNEL
        with _lock:
            log = _log_for(channel)
            event = Event(channel, event_type, data, id=log.current_id + 1)
            log.events.append(event)
            if len(log.events) > limit + limit // 4:
                drop = len(log.events) - limit
                del log.events[:drop]
                log.first_id += drop
        return event

    def get_events(self, channel, last_id, limit=100):
        with _lock:
            log = _log_for(channel)
            if last_id == log.current_id:
                return []
            if not (log.first_id - 1 <= last_id < log.current_id):
                raise EventDoesNotExist(f"No such event {last_id}", log.current_id)
            start = last_id + 1 - log.first_id
            return log.events[start : start + limit]

    def get_current_id(self, channel):
        with _lock:
            return _log_for(channel).current_id


def forget_idle_channels(idle_seconds: float) -> int:
    """Drop the logs of channels unused for a while; their readers get stream-reset."""
    cutoff = time.monotonic() - idle_seconds
    with _lock:
        idle = [name for name, log in _channels.items() if log.last_used < cutoff]
        for name in idle:
            del _channels[name]
    return len(idle)


def conversation_id_from_channel(channel: str) -> uuid.UUID | None:
    if not channel.startswith(CHANNEL_PREFIX):
        return None
    try:
        return uuid.UUID(channel[len(CHANNEL_PREFIX) :])
    except ValueError:
        return None


class ConversationChannelManager(ChannelManagerBase):
    def get_channels_for_request(self, request, view_kwargs):
        return {f"{CHANNEL_PREFIX}{view_kwargs['conversation_id']}"}

    def can_read_channel(self, user, channel):
        from chat.selectors import conversation_readable_by

        conversation_id = conversation_id_from_channel(channel)
        if conversation_id is None or user is None:
            return False
        return conversation_readable_by(user=user, conversation_id=conversation_id)

    def is_channel_reliable(self, channel):
        return True
