"""Delivery of events between site processes through Redis pub/sub (EVENTSTREAM_REDIS).

django-eventstream subscribes lazily when a process's first listener arrives, so events
published before the subscription is live never reach that listener, which then waits
forever; and a dropped pub/sub connection is never re-established. Here the subscription
starts with the process, streams wait until it is live before reading the log, and after a
reconnect every local listener re-reads the log, where nothing is missing.
"""

import asyncio
import logging

from django_eventstream.views import get_listener_manager

logger = logging.getLogger(__name__)

_task: asyncio.Task | None = None
_ready = asyncio.Event()


def start(loop: asyncio.AbstractEventLoop) -> None:
    global _task
    manager = get_listener_manager()
    if manager.redis_listener is None or (_task is not None and not _task.done()):
        return
    manager.redis_listener_started = True  # keep django-eventstream from starting its own
    _task = loop.create_task(_deliver(manager), name="event-delivery")


async def ready(timeout: float = 5.0) -> None:
    if get_listener_manager().redis_listener is None:
        return
    await asyncio.wait_for(_ready.wait(), timeout)


async def _deliver(manager) -> None:
    listener = manager.redis_listener
    while True:
        try:
            await listener.pubsub.subscribe("events_channel")
            _ready.set()
            _resync_local_listeners(manager)
            await listener.listen()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.warning("event delivery through Redis broke; reconnecting", exc_info=True)
        _ready.clear()
        await asyncio.sleep(1)
        listener.pubsub = listener.redis_client.pubsub()


def _resync_local_listeners(manager) -> None:
    """Whatever was published while we were not subscribed is in the log: re-read it."""
    with manager.lock:
        listeners = {l for group in manager.listeners_by_channel.values() for l in group}
        for local in listeners:
            local.overflow = True
            local.wake_threadsafe()
