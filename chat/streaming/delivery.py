"""Delivery of events between site processes through Redis pub/sub (EVENTSTREAM_REDIS).

django-eventstream subscribes lazily when a process's first listener arrives, so events
published before the subscription is live never reach that listener, which then waits
forever; and a dropped pub/sub connection is never re-established. Here the subscription
starts with the process, streams wait until it is live before reading the log, and after a
reconnect every local stream re-reads the log, where nothing is missing.
"""

import asyncio
import logging

from chat.streaming import eventstream

logger = logging.getLogger(__name__)

_task: asyncio.Task | None = None
_ready = asyncio.Event()


def start(loop: asyncio.AbstractEventLoop) -> None:
    global _task
    if _task is not None and not _task.done():
        return
    feed = eventstream.redis_feed()
    if feed is None:
        return
    _task = loop.create_task(_deliver(feed), name="event-delivery")


async def ready(timeout: float = 5.0) -> None:
    """Returns once events published from now on will reach this process."""
    if _task is None:
        return
    await asyncio.wait_for(_ready.wait(), timeout)


async def _deliver(feed: eventstream.RedisFeed) -> None:
    while True:
        try:
            await feed.subscribe()
            _ready.set()
            # Whatever was published while we were not subscribed is in the log.
            eventstream.wake_every_subscription()
            await feed.listen()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.warning("event delivery through Redis broke; reconnecting", exc_info=True)
        _ready.clear()
        await asyncio.sleep(1)
        feed.renew()
