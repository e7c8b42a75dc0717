"""Stop, from whichever site process took the request to the one running the relay.

Every site process has one channel-layer channel, in one group that all of them join at
start: a Stop goes to the group, reaches every process, and the one relaying the reply
acts on it (Stops are rare; a reply starts with every send). A group per reply cost each
relay two Redis round trips, a join and a leave, and a burst of sends opened a connection
for each join at once; a receive per relay (200 Redis BZPOPMIN connections for 200
relays) timed out under load and could not be cancelled cleanly. A Stop sent before the
relay listened is still seen: the service sets the row's `stop_requested` flag before it
sends the Stop, and the relay registers its wait before it reads the reply's row (no query
of its own).
"""

import asyncio
import contextlib
import logging
import time
import uuid

from channels.layers import get_channel_layer
from django.db import DatabaseError

from chat.models import Message
from chat.relay.metrics import METRICS

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0
# Every site process's Stop channel is in this group.
STOP_GROUP = "relay-stops"
# The layer forgets a group's members after a day (channels' group_expiry), and a restarted
# Redis at once: each process joins again this often.
REJOIN_SECONDS = 300.0


async def asend_stop(message_id: uuid.UUID) -> None:
    await get_channel_layer().group_send(
        STOP_GROUP, {"type": "relay.stop", "message_id": str(message_id)}
    )


class StopSignals:
    """This process's receiver of Stop signals, and the waits of its relays."""

    def __init__(self) -> None:
        self.channel: str | None = None
        self.joined_at = 0.0
        self.ready = asyncio.Event()
        self.waiting: dict[uuid.UUID, asyncio.Event] = {}

    async def receive_forever(self) -> None:
        layer = get_channel_layer()
        self.channel = await layer.new_channel()
        while not await self.join(layer):
            await asyncio.sleep(POLL_SECONDS)
        while True:
            try:
                message = await layer.receive(self.channel)
            except Exception:
                logger.warning("receiving Stop signals failed; retrying", exc_info=True)
                METRICS.failure("stop_channel")
                await asyncio.sleep(POLL_SECONDS)
                await self.join(layer)  # Redis may have restarted, without the group
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.waiting[uuid.UUID(message["message_id"])].set()

    async def join(self, layer=None) -> bool:
        """Put this process's channel in the Stop group (again); True when it is."""
        try:
            await (layer or get_channel_layer()).group_add(STOP_GROUP, self.channel)
        except Exception:
            logger.warning("cannot listen for Stop; relays watch the database", exc_info=True)
            METRICS.failure("stop_channel")
            self.ready.clear()
            return False
        self.joined_at = time.monotonic()
        self.ready.set()
        return True

    async def rejoin_when_due(self) -> None:
        """From the relay's sweeper: join again every REJOIN_SECONDS."""
        if self.channel is not None and time.monotonic() - self.joined_at >= REJOIN_SECONDS:
            await self.join()

    def listen(self, message_id: uuid.UUID) -> bool:
        """Hear Stops of this reply from now on: True when the channel layer delivers them,
        False when it cannot (wait_for_stop then watches the row's flag). The relay calls
        it before reading the reply's row, so that a Stop sent before is in that read."""
        self.waiting[message_id] = asyncio.Event()
        # Before the receiver joined the group (the loop's first turns, or Redis down)
        # this reply watches the flag instead of waiting for it.
        return self.ready.is_set()

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

    def forget(self, message_id: uuid.UUID) -> None:
        """Stop hearing Stops of this reply (its relay has ended)."""
        self.waiting.pop(message_id, None)


async def _stop_flagged(message_id: uuid.UUID) -> bool:
    try:
        return await Message.objects.filter(pk=message_id, stop_requested=True).aexists()
    except DatabaseError:
        return False
