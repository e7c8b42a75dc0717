"""The one place that touches django-eventstream (pinned at 5.3.4 in requirements.txt).

We keep django-eventstream for its event model, storage interface, SSE id format and
listener manager, but not its view: that view holds an OS thread per open stream and
replays events twice when new ones arrive while it reads the log (see
chat/streaming/sse.py). Nor its `send_event` and Redis delivery (EVENTSTREAM_REDIS, not
set): those made two Redis round trips per event from a worker thread, and woke each
listener across threads; chat/streaming/delivery.py publishes from the event loop instead.
Serving streams ourselves means driving its listener manager directly, and that is
internal state, not a public API:

- `ListenerManager.lock`, `.listeners_by_channel`, `add_listener` / `remove_listener`;
- `Listener.channel_items`, `.overflow`, `.aevent`, `assign_loop`, `wake_threadsafe` (and
  the attributes we add to it: `user_id`, `channels`, `sink`).

An upgrade of django-eventstream must re-check exactly this module; nothing else imports it.
"""

import asyncio
import json
import logging

from django.core.serializers.json import DjangoJSONEncoder
from django_eventstream.channelmanager import ChannelManagerBase
from django_eventstream.event import Event
from django_eventstream.storage import EventDoesNotExist, StorageBase
from django_eventstream.utils import get_storage, make_id, parse_last_event_id
from django_eventstream.views import Listener, get_listener_manager

logger = logging.getLogger(__name__)

# One per process (a module global of django-eventstream's views).
listener_manager = get_listener_manager()

__all__ = [
    "ChannelManagerBase",
    "Event",
    "EventDoesNotExist",
    "StorageBase",
    "Subscription",
    "append_and_notify",
    "encode",
    "id_prefix",
    "notify",
    "parse_resume_ids",
    "storage",
    "wake_every_subscription",
]

# Events a subscription may have queued before it must re-read the log (django-eventstream's
# own limit is 10; the log makes overflow harmless, this only makes it rarer).
QUEUE_LIMIT = 1000
# uvloop's timers ring to the millisecond: one may ring a hair before its deadline.
TIMER_TOLERANCE = 0.005


def storage() -> StorageBase:
    """The storage named by EVENTSTREAM_STORAGE_CLASS (one instance per thread)."""
    return get_storage()


def id_prefix(channel: str) -> str:
    """What goes before the numeric id in an SSE `id:` line for one channel."""
    return make_id({channel: ""})


def parse_resume_ids(raw: str) -> dict[str, str]:
    """A Last-Event-ID value → {channel: id}."""
    return parse_last_event_id(raw)


def encode(data: dict) -> str:
    """An event's data as the log keeps it (what django-eventstream's send_event would
    store)."""
    return json.dumps(data, cls=DjangoJSONEncoder)


def append_and_notify(log: StorageBase, channel: str, event_type: str, data: str) -> Event:
    """Append `data` (JSON text, see `encode`) to `log` and queue the event for this
    process's subscriptions, waking them (one process: the in-memory log).

    Only from the event loop's thread, where every subscription waits: this skips what
    django-eventstream's `send_event` adds (a GRIP publish nothing receives, a cross-thread
    wake-up)."""
    event = log.append_event(channel, event_type, data)
    notify(event)
    return event


def notify(event: Event) -> None:
    """Queue an event already in the log for this process's subscriptions of its channel,
    waking them. Only from the event loop's thread."""
    channel = event.channel
    with listener_manager.lock:
        for listener in listener_manager.listeners_by_channel.get(channel, ()):
            # A stream waiting with nothing queued may take the event there and then
            # (Subscription.sink), instead of being woken to take it from the queue.
            if getattr(listener, "sink", None) is not None and _sunk(listener, event):
                continue
            queued = listener.channel_items.setdefault(channel, [])
            if len(queued) < QUEUE_LIMIT:
                queued.append(event)
            else:
                listener.overflow = True
            listener.aevent.set()


def _sunk(listener: Listener, event: Event) -> bool:
    if listener.channel_items or listener.overflow:
        return False  # queued events go first
    try:
        return listener.sink(event)
    except Exception:  # the queue still delivers it; the publisher must not fail
        logger.exception("an event stream's sink failed")
        return False


class Subscription:
    """One open stream's place in the listener manager: events queued for it since the
    last `take`, and whether some were dropped (then the log has them)."""

    def __init__(self, channel: str, user_id, sink=None) -> None:
        """sink(event) -> bool, on the loop: takes an event published while this stream
        waits with nothing queued, or returns False (then it is queued as ever). Waking the
        stream's task for each event and writing from there cost more than the write."""
        self.channel = channel
        self.listener = Listener()
        self.listener.user_id = user_id
        self.listener.channels = {channel}
        self.listener.sink = None  # the sink, while `wait` waits
        self.sink = sink
        self.timer: asyncio.TimerHandle | None = None

    def open(self) -> None:
        self.listener.assign_loop()
        listener_manager.add_listener(self.listener)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.listener.aevent.set()
        listener_manager.remove_listener(self.listener)

    def take(self) -> tuple[list[Event], bool]:
        """The queued events and the overflow flag, leaving the queue empty."""
        listener = self.listener
        with listener_manager.lock:
            items = listener.channel_items.get(self.channel, [])
            overflow = listener.overflow
            listener.aevent.clear()
            listener.channel_items = {}
            listener.overflow = False
        return items, overflow

    async def wait(self, timeout: float) -> bool:
        """True when something was queued, False after `timeout` seconds of quiet.

        Not asyncio.wait_for: on Python 3.11 it wraps the wait in a new task every call,
        which at thousands of events a second was a visible part of the site's CPU. Nor a
        timer per wait: one timer stays armed across waits, and when it rings before this
        wait's quiet is over (it was armed by an earlier wait) it is armed again for the
        rest, so a busy stream sets one timer per `timeout` instead of one per event."""
        listener = self.listener
        event = listener.aevent
        if event.is_set():
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.timer is None:
                self.timer = loop.call_at(deadline, self._ring)
            listener.sink = self.sink
            try:
                await event.wait()
            finally:
                listener.sink = None
            if listener.channel_items or listener.overflow:
                return True
            if loop.time() >= deadline - TIMER_TOLERANCE:
                return False
            event.clear()  # an earlier wait's timer rang: the quiet is not over yet

    def _ring(self) -> None:
        self.timer = None
        self.listener.aevent.set()


def wake_every_subscription() -> None:
    """Make every open stream of this process re-read the log (after missed deliveries)."""
    with listener_manager.lock:
        listeners = {
            one for group in listener_manager.listeners_by_channel.values() for one in group
        }
        for listener in listeners:
            listener.overflow = True
            listener.wake_threadsafe()
