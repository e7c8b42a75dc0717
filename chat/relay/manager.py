"""The relays of one site process: start and stop them, save their text, and mark replies
orphaned by a dead process as interrupted.

Tokens that reach a relay together (one network read) go out as one `token` event, so
`seq` numbers events and `text` may hold several tokens. The page never needs to know.
"""

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
import uuid

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError

from chat import usage
from chat.inference_client import (
    ChatRequest,
    Delta,
    Finish,
    InferenceError,
    Progress,
    get_client,
)
from chat.models import Conversation, Message
from chat.relay import prompt, saving
from chat.relay.metrics import METRICS
from chat.relay.reply import CANCELLED, Reply, final_state, reply_usage
from chat.relay.stop import StopSignals, asend_stop
from chat.streaming import memory_log
from chat.streaming.publish import (
    apublish,
    local_delivery,
    message_error_data,
    publish_encoded,
    publish_later,
)

logger = logging.getLogger(__name__)

SWEEP_INTERVAL = 5.0
IDLE_CHANNEL_SECONDS = 3600.0
FINAL_WRITE_ATTEMPTS = 30
CLEANUP_SECONDS = 5.0
# How long the end of a /v1 API reply waits for its reader's tap (RelayManager.ended).
ENDED_KEPT_SECONDS = 60.0
# The most often a reply's `message.progress` events go out while its prompt is read: a page
# needs no more to move a progress bar, and a paste's every step would fill the event log.
PROGRESS_INTERVAL = 0.25


class RelayManager:
    def __init__(self) -> None:
        self.relays: dict[uuid.UUID, asyncio.Task] = {}
        self.unsaved: dict[uuid.UUID, Reply] = {}  # replies with text not yet saved
        self.loop: asyncio.AbstractEventLoop | None = None
        self.background: list[asyncio.Task] = []
        self.stops = StopSignals()
        # Replies being relayed, and in-process readers of them (the /v1 API).
        self.live: dict[uuid.UUID, Reply] = {}
        self.taps: dict[uuid.UUID, list[asyncio.Queue]] = {}
        # The end of each /v1 API reply, until its reader taps it: the relay starts at the
        # commit and can end (a server that refuses at once) before the view, resumed only
        # after that, taps it; the end's `kind` exists nowhere else.
        self.ended: dict[uuid.UUID, tuple[float, tuple]] = {}

    # --- lifecycle -------------------------------------------------------------------
    def ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is loop:
            return
        self.loop = loop
        self.relays.clear()
        self.unsaved.clear()
        self.live.clear()
        self.taps.clear()
        self.ended.clear()
        self.stops = StopSignals()
        self.background = [
            _detached_task(loop, self.stops.receive_forever(), name="relay-stop-receiver"),
            _detached_task(loop, self._writer(), name="relay-writer"),
            _detached_task(loop, self._sweeper(), name="relay-sweeper"),
            _detached_task(loop, _learn_default_model(), name="relay-default-model"),
        ]

    async def aclose(self) -> None:
        """Cancel every relay and background task of this loop (tests; a daphne process
        simply exits, and the sweeper of a surviving one marks its replies interrupted)."""
        tasks = [*self.relays.values(), *self.background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.loop = None
        self.background = []

    def start(
        self, message_id: uuid.UUID, known: Message | None = None, path: list | None = None
    ) -> asyncio.Task:
        """known and path: what the send that made the reply holds (saving.reply_load)."""
        self.ensure_started()
        task = _detached_task(asyncio.get_running_loop(), self._relay(message_id, known, path))
        self.relays[message_id] = task
        task.add_done_callback(lambda _: self.relays.pop(message_id, None))
        return task

    def launch(
        self, message_id: uuid.UUID, known: Message | None = None, path: list | None = None
    ) -> bool:
        """Start a relay from any thread (sync views run in a worker thread under ASGI)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            logger.error(
                "no event loop to relay %s on: is the site running under ASGI?", message_id
            )
            return False
        if _running_loop() is loop:
            self.start(message_id, known, path)
        else:
            loop.call_soon_threadsafe(
                self.start, message_id, known, path, context=contextvars.Context()
            )
        return True

    def request_stop(self, message_id: uuid.UUID) -> None:
        """From any thread; the Stop reaches the relay in whichever process runs it."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        if _running_loop() is loop:
            loop.create_task(asend_stop(message_id))
        else:
            asyncio.run_coroutine_threadsafe(asend_stop(message_id), loop).result(timeout=5)

    # --- one reply -------------------------------------------------------------------
    async def _relay(self, message_id: uuid.UUID, known: Message | None, path) -> None:
        # Listening first: a Stop sent before then shows in the row read next.
        listening = self.stops.listen(message_id)
        try:
            await self._relay_listening(message_id, known, path, listening)
        finally:
            self.stops.forget(message_id)

    async def _relay_listening(
        self, message_id: uuid.UUID, known: Message | None, path, listening: bool
    ) -> None:
        try:
            message, request = await sync_to_async(saving.reply_load)(
                message_id=message_id, known=known, path=path
            )
        except Message.DoesNotExist:
            return
        reply = Reply(
            message_id=message.id,
            conversation_id=message.conversation_id,
            model="",
            owner_id=message.conversation.owner_id,
            source=message.conversation.source,
            prompt_estimate=prompt.request_tokens(request),
            timestamps=settings.RELAY_EVENT_TIMESTAMPS,
            local=local_delivery(),
        )
        reply.model = request.model or await get_client().default_model()
        METRICS.relay_started()
        try:
            start = {"message_id": str(message_id), "model": reply.model}
            self.live[message_id] = reply
            self._tell(message_id, ("start", start))
            await apublish(reply.conversation_id, "message.start", start)
            stop = self.stops.wait_for_stop(message_id, listening, message.stop_requested)
            outcome = await self._stream(reply, request, stop)
        except Exception as exc:  # the relay must always end the reply, whatever broke
            logger.exception("relay for %s failed", message_id)
            outcome = InferenceError(
                f"Something went wrong on the site while writing this reply ({type(exc).__name__}).",
                retryable=True,
                kind="internal",
            )
        finally:
            METRICS.relay_ended()
        await self._finish(reply, outcome)

    async def _stream(self, reply: Reply, request: ChatRequest, wait_for_stop):
        """Returns CANCELLED, None (the stream ended) or the InferenceError that ended it.
        wait_for_stop: a coroutine that returns when the user pressed Stop."""
        pump = asyncio.create_task(self._pump(reply, request))
        publisher = asyncio.create_task(self._publisher(reply))
        stop = asyncio.create_task(wait_for_stop)
        try:
            await asyncio.wait({pump, stop}, return_when=asyncio.FIRST_COMPLETED)
            cancelled = stop.done() and not pump.done()
            if cancelled:
                pump.cancel()
            results = await asyncio.gather(pump, return_exceptions=True)
            await publisher
        finally:
            for task in (pump, publisher, stop):
                task.cancel()
            # Bounded: a library that swallows a cancellation must not hold the reply open.
            _, stuck = await asyncio.wait({pump, publisher, stop}, timeout=CLEANUP_SECONDS)
            if stuck:
                logger.error("relay tasks of %s did not stop: %s", reply.message_id, stuck)
        if cancelled:
            return CANCELLED
        error = results[0]
        if isinstance(error, BaseException):
            if isinstance(error, InferenceError):
                return error
            raise error
        return None

    async def _pump(self, reply: Reply, request: ChatRequest) -> None:
        take = functools.partial(self._take, reply)
        try:
            stream = get_client().stream_chat(request, on_delta=take)
            async with contextlib.aclosing(stream):
                async for item in stream:
                    if isinstance(item, Delta):
                        take(item.text, item.produced_at)
                    elif isinstance(item, Finish):
                        reply.finish = item
                    elif isinstance(item, Progress):
                        await self._progress(reply, item)
        finally:
            reply.done = True
            reply.wake.set()

    async def _progress(self, reply: Reply, progress: Progress) -> None:
        """How far the server has read the prompt, as a `message.progress` event: before the
        first token only, at most one per PROGRESS_INTERVAL. Best effort: a progress event
        that cannot be published is skipped (the tokens' own publishing reports a failure)."""
        now = time.monotonic()
        if reply.deltas or now - reply.progress_at < PROGRESS_INTERVAL:
            return
        reply.progress_at = now
        data = {
            "message_id": str(reply.message_id),
            "processed": progress.processed,
            "total": progress.total,
        }
        try:
            await apublish(reply.conversation_id, "message.progress", data)
        except Exception:  # noqa: BLE001 - see above
            logger.warning("a progress event of %s was not published", reply.message_id)

    def _take(self, reply: Reply, text: str, produced_at: float | None) -> None:
        """A Delta's text, yielded to the pump or handed on from the connection's read."""
        if reply.ttft is None:
            reply.ttft = time.monotonic() - reply.started
        reply.deltas += 1
        reply.produced_at = produced_at
        reply.buffer.append(text)
        self._wake(reply)

    def _wake(self, reply: Reply) -> None:
        """Text arrived: a callback at the end of this loop turn publishes whatever the turn
        brought as one event, with no task to wake for every token. On one process it is
        published there and then; with Redis it joins the loop turn's batch of every
        reply's events (chat/streaming/delivery.py), and counts as sent once in the log."""
        if not reply.publish_pending:
            reply.publish_pending = True
            asyncio.get_running_loop().call_soon(self._publish_now, reply)

    def _publish_now(self, reply: Reply) -> None:
        reply.publish_pending = False
        if not reply.buffer or reply.publish_error is not None:
            return
        text = "".join(reply.buffer)
        reply.buffer.clear()
        channel = reply.channel
        try:
            if reply.local:
                publish_encoded(channel, "token", reply.token_event(text))
            else:
                publish_later(
                    channel,
                    "token",
                    reply.token_event(text),
                    lambda _, error: self._token_published(reply, text, error),
                )
                reply.unconfirmed += 1
                return
        except Exception as exc:  # the publisher task raises it, and the relay ends the reply
            self._publish_failed(reply, exc)
            return
        self._token_sent(reply, text)

    def _token_published(self, reply: Reply, text: str, error: BaseException | None) -> None:
        """With Redis: one of the reply's token events is in the log (in order), or failed
        (then so did every event published after it: delivery.RedisPublisher._send)."""
        reply.unconfirmed -= 1
        if error is not None:
            self._publish_failed(reply, error)
        elif reply.publish_error is None:
            self._token_sent(reply, text)
        if reply.done and not reply.unconfirmed:
            reply.wake.set()

    def _publish_failed(self, reply: Reply, error: BaseException) -> None:
        if reply.publish_error is None:
            reply.publish_error = error
        reply.wake.set()

    async def _publisher(self, reply: Reply) -> None:
        """Returns once the stream ended and all its text is published; raises what made
        publishing fail."""
        while True:
            await reply.wake.wait()
            reply.wake.clear()
            if reply.done and reply.buffer:
                self._publish_now(reply)  # what the pump's last turn brought
            if reply.publish_error is not None:
                raise reply.publish_error
            if reply.done and not reply.buffer and not reply.unconfirmed:
                return

    def _token_sent(self, reply: Reply, text: str) -> None:
        reply.parts.append(text)
        self._tell(reply.message_id, ("token", text))
        reply.seq += 1
        self.unsaved[reply.message_id] = reply
        METRICS.token_event(reply.produced_at)

    async def _finish(self, reply: Reply, outcome) -> None:
        self.unsaved.pop(reply.message_id, None)
        fields, event, data = final_state(reply, outcome)
        kind = getattr(outcome, "kind", None)
        METRICS.reply_finished(fields["status"], kind)
        await self._save_final(reply.message_id, fields, reply_usage(reply, fields))
        # Readers learn the end once it is saved (and counted).
        self.live.pop(reply.message_id, None)
        end = ("end", {"fields": fields, "kind": kind})
        if reply.source == Conversation.Source.API and reply.message_id not in self.taps:
            self.ended[reply.message_id] = (time.monotonic(), end)
        self._tell(reply.message_id, end)
        await apublish(reply.conversation_id, event, data)

    # --- in-process readers ----------------------------------------------------------
    def tap(self, message_id: uuid.UUID) -> asyncio.Queue:
        """On the loop: a queue of the reply's ("start", data), ("token", text) and finally
        ("end", {"fields", "kind"}) items. A reply already under way first gives what it
        published so far, as one token; a /v1 API reply that ended before the tap gives its
        end; another gives nothing (the reader then finds it ended in the database)."""
        queue: asyncio.Queue = asyncio.Queue()
        self.taps.setdefault(message_id, []).append(queue)
        reply = self.live.get(message_id)
        ended = self.ended.pop(message_id, None)
        if ended is not None:
            queue.put_nowait(ended[1])
        elif reply is not None:
            queue.put_nowait(("start", {"message_id": str(message_id), "model": reply.model}))
            if reply.parts:
                queue.put_nowait(("token", "".join(reply.parts)))
        return queue

    def untap(self, message_id: uuid.UUID, queue: asyncio.Queue) -> None:
        queues = self.taps.get(message_id, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            self.taps.pop(message_id, None)

    def _tell(self, message_id: uuid.UUID, item: tuple) -> None:
        for queue in self.taps.get(message_id, ()):
            queue.put_nowait(item)

    async def _save_final(self, message_id: uuid.UUID, fields: dict, usage) -> None:
        """Retried, because a reply's final text must not be lost to a brief lock."""
        for attempt in range(FINAL_WRITE_ATTEMPTS):
            try:
                await sync_to_async(saving.reply_finish)(
                    message_id=message_id, fields=fields, usage=usage
                )
                return
            except DatabaseError:
                logger.warning("saving reply %s failed (attempt %d)", message_id, attempt + 1)
                METRICS.failure("db_write")
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
        logger.error("gave up saving reply %s", message_id)

    # --- background ------------------------------------------------------------------
    async def _writer(self) -> None:
        while True:
            await asyncio.sleep(settings.RELAY_FLUSH_INTERVAL)
            await self.flush()

    async def flush(self) -> None:
        dirty, self.unsaved = self.unsaved, {}
        alive = list(self.relays)
        if not dirty and not alive:
            return
        batch = {message_id: (reply.content, reply.seq) for message_id, reply in dirty.items()}
        try:
            await sync_to_async(saving.reply_flush)(contents=batch, alive=alive)
        except DatabaseError:
            logger.warning("saving streamed text failed; retrying at the next flush")
            METRICS.failure("db_write")
            for message_id, reply in dirty.items():
                self.unsaved.setdefault(message_id, reply)

    async def _sweeper(self) -> None:
        while True:
            try:
                await self.sweep()
            except DatabaseError:
                logger.warning("sweeping orphaned replies failed", exc_info=True)
            await self.stops.rejoin_when_due()
            memory_log.forget_idle_channels(IDLE_CHANNEL_SECONDS)
            self._forget_old_ends()
            await asyncio.sleep(SWEEP_INTERVAL)

    def _forget_old_ends(self) -> None:
        """Ends of API replies whose reader never tapped them (it went away)."""
        cutoff = time.monotonic() - ENDED_KEPT_SECONDS
        for message_id in [i for i, (at, _) in self.ended.items() if at < cutoff]:
            del self.ended[message_id]

    async def sweep(self) -> None:
        """The periodic database work: orphaned replies, and old rate-limit rows (which each
        send used to delete itself: services._charge)."""
        await sync_to_async(usage.usage_events_prune)()
        orphans = await sync_to_async(saving.replies_interrupt_orphans)(
            stale_after=settings.RELAY_STALE_AFTER, exclude=set(self.relays)
        )
        for message in orphans:
            data = message_error_data(message.id, message.error, message.retryable)
            await apublish(message.conversation_id, "message.error", data)


async def _learn_default_model() -> None:
    """Ask the inference server its model once at start, not during the first reply."""
    try:
        await get_client().default_model()
    except Exception:  # the server may be down now; the first reply asks again
        logger.info("the inference server did not say its model yet", exc_info=True)


def _detached_task(loop, coro, name=None) -> asyncio.Task:
    """A task that outlives the request that started it: it must not inherit the request's
    context, whose thread executor for sync_to_async closes with the response."""
    return loop.create_task(coro, name=name, context=contextvars.Context())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


relay_manager = RelayManager()
