"""Events between site processes through Redis (REDIS_URL): publishing to the shared log,
and receiving what every process published.

Publishing runs on the event loop: the events published during one loop turn go to Redis
as one script call (redis_log.APPEND_MANY), which appends them to the log and announces
them on pub/sub in one message; the next batch goes once that call returned, so a
channel's events reach the log and every process in order. The publishing process hands
its events to its own streams when the call returns, and skips its own announcements.
Both directions go through chat/streaming/resp.py's lean connection, not redis-py's client.

Receiving: the subscription starts with the process, streams wait until it is live before
reading the log (events published before it would never reach them otherwise), and after a
dropped subscription reconnects every local stream re-reads the log, where nothing is
missing.
"""

import asyncio
import contextvars
import logging
import uuid
from collections.abc import Callable

from django.conf import settings

from chat.streaming import eventstream, redis_log, resp
from chat.streaming.eventstream import Event

logger = logging.getLogger(__name__)

# This process, in announcements: its own are delivered when published, not again.
ORIGIN = uuid.uuid4().hex
# Events in one script call at most (Redis runs a script alone: keep each one short).
MAX_BATCH = 500
# A script call unanswered this long fails its batch (and the replies end failed) rather
# than holding every reply of the process silent behind it.
CALL_TIMEOUT = 10.0

_task: asyncio.Task | None = None
_ready = asyncio.Event()
_publisher: "RedisPublisher | None" = None

Done = Callable[[Event | None, BaseException | None], None]


def start(loop: asyncio.AbstractEventLoop) -> None:
    global _task
    if _task is not None and not _task.done():
        return
    if not settings.REDIS_URL:
        return
    _task = loop.create_task(_deliver(RedisFeed()), name="event-delivery")


async def ready(timeout: float = 5.0) -> None:
    """Returns once events published from now on will reach this process."""
    if _task is None:
        return
    await asyncio.wait_for(_ready.wait(), timeout)


async def _deliver(feed: "RedisFeed") -> None:
    while True:
        try:
            await feed.subscribe()
            _ready.set()
            # Whatever was published while we were not subscribed is in the log.
            eventstream.wake_every_subscription()
            await feed.listen()
        except asyncio.CancelledError:
            feed.close()
            raise
        except Exception:
            logger.warning("event delivery through Redis broke; reconnecting", exc_info=True)
        _ready.clear()
        feed.close()
        await asyncio.sleep(1)


class RedisFeed:
    """The announcements of every process (redis_log.TOPIC), handed to this process's
    streams."""

    def __init__(self) -> None:
        self.connection: resp.Connection | None = None

    async def subscribe(self) -> None:
        self.connection = await resp.connect(settings.REDIS_URL)
        await self.connection.subscribe(redis_log.TOPIC, _announcement)

    async def listen(self) -> None:
        """Until the connection breaks (then raises)."""
        error = await asyncio.shield(self.connection.lost)
        raise resp.ConnectionLost(f"the subscription's connection closed ({error or 'by Redis'})")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _announcement(payload: bytes) -> None:
    try:
        deliver(payload)
    except Exception:  # one bad announcement must not take the subscription down
        logger.exception("an announcement could not be delivered")


def deliver(payload: bytes) -> None:
    """One announcement to this process's streams, unless this process published it."""
    if payload.startswith(ORIGIN.encode()):
        return
    _, events = redis_log.announced(payload)
    for event in events:
        eventstream.notify(event)


class RedisPublisher:
    """Appends events to the Redis log and announces them, a loop turn's events at a time.
    One per event loop (its client's connections belong to that loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.connection: resp.Connection | None = None
        self.queue: list[tuple[str, str, str, Done]] = []
        self.wake = asyncio.Event()
        self.task = loop.create_task(
            self._run(), name="event-publisher", context=contextvars.Context()
        )

    def publish(self, channel: str, event_type: str, data: str, done: Done) -> None:
        """On the loop. `done(event, None)` once the event is in the log, or
        `done(None, error)`; called on the loop, in the order of publishing."""
        if "\n" in data or "\n" in event_type or "\n" in channel:
            raise ValueError(
                "channel, event type and data may not hold a newline (JSON data never does)"
            )
        self.queue.append((channel, event_type, data, done))
        self.wake.set()

    async def apublish(self, channel: str, event_type: str, data: str) -> Event:
        future = self.loop.create_future()

        def done(event, error) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(event)

        self.publish(channel, event_type, data, done)
        return await future

    async def _run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue:
                batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
                await self._send(batch)

    async def _send(self, batch: list[tuple[str, str, str, Done]]) -> None:
        args = redis_log.append_many_args([item[:3] for item in batch], ORIGIN)
        try:
            ids = await self._append(args)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._disconnect()
            # What was queued behind the batch fails too: a reply's events in the log stay
            # a prefix of those it published (the relay then ends the reply).
            failed, self.queue = batch + self.queue, []
            for *_, done in failed:
                _call(done, None, exc)
            return
        for (channel, event_type, data, done), event_id in zip(batch, ids):
            event = Event(channel, event_type, data, id=event_id)
            eventstream.notify(event)
            _call(done, event, None)

    async def _append(self, args: list) -> list[int]:
        """APPEND_MANY: the events' ids. The script is sent by its digest, and whole only
        when Redis does not know it (a new or restarted server)."""
        if self.connection is None or self.connection.lost.done():
            # nothing was sent on a connection known to be closed: a new one is safe
            self.connection = await resp.connect(settings.REDIS_URL)
        call = self.connection.call
        try:
            ids = await call("EVALSHA", redis_log.APPEND_MANY_SHA, 0, *args, timeout=CALL_TIMEOUT)
        except resp.RedisError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            ids = await call("EVAL", redis_log.APPEND_MANY, 0, *args, timeout=CALL_TIMEOUT)
        return [int(event_id) for event_id in ids.split()]

    def _disconnect(self) -> None:
        """After a failed call: the next batch opens a new connection."""
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _call(done: Done, event: Event | None, error: BaseException | None) -> None:
    try:
        done(event, error)
    except Exception:
        logger.exception("an event's publisher failed to take its result")


def publisher() -> RedisPublisher:
    """This loop's publisher (only with REDIS_URL, only on the loop)."""
    global _publisher
    loop = asyncio.get_running_loop()
    if _publisher is None or _publisher.loop is not loop or _publisher.task.done():
        _publisher = RedisPublisher(loop)
    return _publisher


def forget_publisher() -> None:
    """The next publish makes a new publisher (a test changed REDIS_URL)."""
    global _publisher
    _publisher = None
