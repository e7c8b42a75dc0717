"""Stop, from whichever site process took the request to the one running the relay.

One channel-layer channel per process receives every Stop for its relays: 200 relays each
blocked in their own receive meant 200 Redis BZPOPMIN connections, which timed out under
load and could not be cancelled cleanly. A Stop sent before the relay listened is still
seen: the service also sets the row's `stop_requested` flag, which the relay reads with the
reply's row once it listens (no query of its own).
"""

import asyncio
import contextlib
import logging
import uuid

from channels.layers import get_channel_layer
from django.db import DatabaseError

from chat.models import Message
from chat.relay.metrics import METRICS

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0


def stop_group(message_id) -> str:
    return f"relay-stop-{uuid.UUID(str(message_id)).hex}"


async def asend_stop(message_id: uuid.UUID) -> None:
    await get_channel_layer().group_send(
        stop_group(message_id), {"type": "relay.stop", "message_id": str(message_id)}
    )


class StopSignals:
    """This process's receiver of Stop signals, and the waits of its relays."""

    def __init__(self) -> None:
        self.channel: str | None = None
        self.ready = asyncio.Event()
        self.waiting: dict[uuid.UUID, asyncio.Event] = {}

    async def receive_forever(self) -> None:
        layer = get_channel_layer()
        self.channel = await layer.new_channel()
        self.ready.set()
        while True:
            try:
                message = await layer.receive(self.channel)
            except Exception:
                logger.warning("receiving Stop signals failed; retrying", exc_info=True)
                METRICS.failure("stop_channel")
                await asyncio.sleep(POLL_SECONDS)
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.waiting[uuid.UUID(message["message_id"])].set()

    async def listen(self, message_id: uuid.UUID) -> bool:
        """Hear Stops of this reply from now on: True once the channel layer delivers them,
        False when it cannot (wait_for_stop then watches the row's flag). The relay calls
        it before reading the reply's row, so that a Stop sent before is in that read."""
        self.waiting[message_id] = asyncio.Event()
        if not self.ready.is_set():
            # The receiver has no channel yet (it gets one on the loop's first turns): the
            # relay must not wait on it to start, so this reply watches the flag instead.
            return False
        return await self._listen(get_channel_layer(), message_id)

    async def wait_for_stop(self, message_id: uuid.UUID, listening: bool, flagged: bool) -> None:
        """Returns only when the user pressed Stop (a signal through the channel layer, or
        the row's flag). listening: what listen() returned; flagged: the row's
        stop_requested as read after listen() began (a Stop sent before we listened)."""
        if flagged:
            return
        if listening:
            await self.waiting[message_id].wait()
            return
        while not await _stop_flagged(message_id):
            await asyncio.sleep(POLL_SECONDS)

    async def forget(self, message_id: uuid.UUID) -> None:
        """Stop hearing Stops of this reply (its relay has ended)."""
        self.waiting.pop(message_id, None)
        with contextlib.suppress(Exception):
            await get_channel_layer().group_discard(stop_group(message_id), self.channel)

    async def _listen(self, layer, message_id: uuid.UUID) -> bool:
        try:
            await layer.group_add(stop_group(message_id), self.channel)
            return True
        except Exception:
            logger.warning(
                "cannot listen for Stop of %s; watching the database", message_id, exc_info=True
            )
            METRICS.failure("stop_channel")
            return False


async def _stop_flagged(message_id: uuid.UUID) -> bool:
    try:
        return await Message.objects.filter(pk=message_id, stop_requested=True).aexists()
    except DatabaseError:
        return False
