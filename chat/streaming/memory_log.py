"""The event log of one site process, behind django-eventstream's storage interface.

django-eventstream without storage drops tokens past 10 queued events, and its
DjangoModelStorage costs a database transaction per event. This log keeps each channel's
recent events in process memory: appending is a lock and a list append, and a listener that
overflowed re-reads what it missed from here. Ids start at the microsecond clock when a
channel is first seen in this process, so an id from before a restart is never mistaken
for a new one: it is unknown, the client gets `stream-reset`, and the page reloads the
message from the JSON API (whose `next_seq` tells it which token events it already has).

The whole log is bounded in bytes (EVENTLOG_MAX_BYTES): past it, the channels used least
recently (appended to or read) are forgotten, exactly as after a restart. A stream still
reading one gets `stream-reset` at its next event and reloads, so no token is shown twice;
one busy channel alone over the bound keeps only its newest events.
"""

import threading
import time
from collections import OrderedDict

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from chat.streaming.eventstream import ChannelManagerBase, Event, EventDoesNotExist, StorageBase

# What an event costs besides its text: the Event object, its id, the string header, the
# list slot. With tracemalloc a typical 81-character token event took 283 bytes; this
# counts 290 for it.
EVENT_OVERHEAD_BYTES = 200
CHANNEL_OVERHEAD_BYTES = 500


def _size(event: Event) -> int:
    return len(event.data) + len(event.type) + EVENT_OVERHEAD_BYTES


class _ChannelLog:
    __slots__ = ("first_id", "events", "last_used", "bytes")

    def __init__(self) -> None:
        # first_id is the id the first kept event has (or would have).
        self.first_id = time.time_ns() // 1000 + 1
        self.events: list[Event] = []
        self.last_used = time.monotonic()
        self.bytes = CHANNEL_OVERHEAD_BYTES

    @property
    def current_id(self) -> int:
        return self.first_id + len(self.events) - 1

    def drop_oldest(self, count: int) -> int:
        freed = sum(_size(event) for event in self.events[:count])
        del self.events[:count]
        self.first_id += count
        self.bytes -= freed
        return freed


# Module-level state: django-eventstream keeps one storage instance per thread, but every
# thread of the process must see the same log. Ordered least recently used first.
_lock = threading.Lock()
_channels: "OrderedDict[str, _ChannelLog]" = OrderedDict()
_bytes = 0


def _log_for(channel: str) -> _ChannelLog:
    global _bytes
    log = _channels.get(channel)
    if log is None:
        log = _channels[channel] = _ChannelLog()
        _bytes += log.bytes
    else:
        _channels.move_to_end(channel)
    log.last_used = time.monotonic()
    return log


def _forget(name: str) -> None:
    global _bytes
    _bytes -= _channels.pop(name).bytes


def _evict(keep: _ChannelLog) -> None:
    """Bring the log under EVENTLOG_MAX_BYTES; `keep` (being appended to) goes last."""
    global _bytes
    limit = settings.EVENTLOG_MAX_BYTES
    while _bytes > limit and len(_channels) > 1:
        oldest = next(iter(_channels))
        if _channels[oldest] is keep:
            _channels.move_to_end(oldest)
            continue
        _forget(oldest)
    while _bytes > limit and len(keep.events) > 1:
        _bytes -= keep.drop_oldest(max(1, len(keep.events) // 8))


_limits: tuple[int, int] | None = None


def _bounds() -> tuple[int, int]:
    """(events kept per channel, bytes in all), read from the settings once: a lazy
    settings lookup per token event showed in the profile."""
    global _limits
    if _limits is None:
        _limits = (settings.EVENTLOG_MAX_EVENTS_PER_CHANNEL, settings.EVENTLOG_MAX_BYTES)
    return _limits


@receiver(setting_changed)
def _settings_changed(**kwargs) -> None:
    global _limits
    _limits = None


class MemoryEventStorage(StorageBase):
    def append_event(self, channel, event_type, data):
        global _bytes
        limit, max_bytes = _bounds()
        with _lock:
            log = _log_for(channel)
            event = Event(channel, event_type, data, id=log.current_id + 1)
            log.events.append(event)
            size = _size(event)
            log.bytes += size
            _bytes += size
            if len(log.events) > limit + limit // 4:
                _bytes -= log.drop_oldest(len(log.events) - limit)
            if _bytes > max_bytes:
                _evict(log)
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
    global _bytes
    with _lock:
        _channels.clear()
        _bytes = 0


def kept_events(channel: str) -> list[Event]:
    """The events this process still keeps for a channel, oldest first."""
    with _lock:
        log = _channels.get(channel)
        return list(log.events) if log else []


def kept_bytes() -> int:
    with _lock:
        return _bytes


def known_channels() -> set[str]:
    with _lock:
        return set(_channels)


def forget_idle_channels(idle_seconds: float) -> int:
    """Drop the logs of channels unused for a while; their readers get stream-reset."""
    cutoff = time.monotonic() - idle_seconds
    with _lock:
        idle = [name for name, log in _channels.items() if log.last_used < cutoff]
        for name in idle:
            _forget(name)
    return len(idle)


class ConversationChannelManager(ChannelManagerBase):
    """django-eventstream asks this whether to store a channel's events before sending them
    (`send_event`, used with Redis): every conversation event is stored, for replay.
    Who may read a channel is decided by the stream endpoint (chat/streaming/sse.py)."""

    def is_channel_reliable(self, channel):
        return True
