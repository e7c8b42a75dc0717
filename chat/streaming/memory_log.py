"""The event log of one site process, behind django-eventstream's storage interface.

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

from django.conf import settings

from chat.streaming.eventstream import ChannelManagerBase, Event, EventDoesNotExist, StorageBase


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


def forget_all_channels() -> None:
    """What a restart does to this process's log: every reader gets stream-reset."""
    with _lock:
        _channels.clear()


def kept_events(channel: str) -> list[Event]:
    """The events this process still keeps for a channel, oldest first."""
    with _lock:
        log = _channels.get(channel)
        return list(log.events) if log else []


def known_channels() -> set[str]:
    with _lock:
        return set(_channels)


def forget_idle_channels(idle_seconds: float) -> int:
    """Drop the logs of channels unused for a while; their readers get stream-reset."""
    cutoff = time.monotonic() - idle_seconds
    with _lock:
        idle = [name for name, log in _channels.items() if log.last_used < cutoff]
        for name in idle:
            del _channels[name]
    return len(idle)


class ConversationChannelManager(ChannelManagerBase):
    """django-eventstream asks this whether to store a channel's events before sending them
    (`send_event`, used with Redis): every conversation event is stored, for replay.
    Who may read a channel is decided by the stream endpoint (chat/streaming/sse.py)."""

    def is_channel_reliable(self, channel):
        return True
