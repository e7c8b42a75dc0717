"""The token relay: one asyncio task per reply reads the inference stream and republishes it
on the conversation's channel, while one writer saves the streamed text of every reply.

Tokens that reach the relay together (one network read) go out as one `token` event, so
`seq` numbers events and `text` may hold several tokens. The page never needs to know.
"""

import asyncio
import contextlib
import contextvars
import logging
import time
import uuid
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError

from chat import eventlog, prompt, services
from chat.events import apublish, message_error_data
from chat.inference import ChatRequest, Delta, Finish, InferenceError, get_client
from chat.models import Message
from chat.relay_metrics import METRICS

logger = logging.getLogger(__name__)

SWEEP_INTERVAL = 5.0
IDLE_CHANNEL_SECONDS = 3600.0
FINAL_WRITE_ATTEMPTS = 30
STOP_POLL_SECONDS = 1.0
CLEANUP_SECONDS = 5.0


def stop_group(message_id) -> str:
    return f"relay-stop-{uuid.UUID(str(message_id)).hex}"


@dataclass
class Reply:
    message_id: uuid.UUID
    conversation_id: uuid.UUID
    model: str
    started: float = field(default_factory=time.monotonic)
    parts: list[str] = field(default_factory=list)
    buffer: list[str] = field(default_factory=list)
    produced_at: float | None = None
    seq: int = 0
    ttft: float | None = None
    deltas: int = 0
    finish: Finish | None = None
    done: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def content(self) -> str:
        return "".join(self.parts)


class RelayManager:
    """Per process: the running relays, the writer that saves their text, and the sweeper
    that marks replies orphaned by a dead process as interrupted."""

    def __init__(self) -> None:
        self.relays: dict[uuid.UUID, asyncio.Task] = {}
        # Replies with text not yet saved; joined only when saved, not once per token.
        self.unsaved: dict[uuid.UUID, Reply] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.background: list[asyncio.Task] = []
        # One channel-layer channel per process receives every Stop for its relays: 200
        # relays each blocked in their own receive meant 200 Redis BZPOPMIN connections,
        # which timed out under load (measured) and could not be cancelled cleanly.
        self.stop_channel: str | None = None
        self.stop_events: dict[uuid.UUID, asyncio.Event] = {}
        self.stop_channel_ready: asyncio.Event | None = None

    # --- lifecycle -------------------------------------------------------------------
    def ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is loop:
            return
        self.loop = loop
        self.relays.clear()
        self.unsaved.clear()
        self.stop_events.clear()
        self.stop_channel_ready = asyncio.Event()
        self.background = [
            _detached_task(loop, self._stop_receiver(), name="relay-stop-receiver"),
            _detached_task(loop, self._writer(), name="relay-writer"),
            _detached_task(loop, self._sweeper(), name="relay-sweeper"),
            _detached_task(loop, _learn_default_model(), name="relay-default-model"),
        ]

    def start(self, message_id: uuid.UUID) -> asyncio.Task:
        self.ensure_started()
        task = _detached_task(asyncio.get_running_loop(), self._relay(message_id))
        self.relays[message_id] = task
        task.add_done_callback(lambda _: self.relays.pop(message_id, None))
        return task

    def launch(self, message_id: uuid.UUID) -> bool:
        """Start a relay from any thread (sync views run in a worker thread under ASGI)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            logger.error("no event loop to relay %s on: is the site running under ASGI?", message_id)
            return False
        if _running_loop() is loop:
            self.start(message_id)
        else:
            loop.call_soon_threadsafe(self.start, message_id, context=contextvars.Context())
        return True

    def request_stop(self, message_id: uuid.UUID) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        if _running_loop() is loop:
            loop.create_task(self.astop(message_id))
        else:
            asyncio.run_coroutine_threadsafe(self.astop(message_id), loop).result(timeout=5)

    async def astop(self, message_id: uuid.UUID) -> None:
        # Through the channel layer, so a Stop reaches the relay in whichever process runs it.
        await get_channel_layer().group_send(
            stop_group(message_id), {"type": "relay.stop", "message_id": str(message_id)}
        )

    # --- one reply -------------------------------------------------------------------
    async def _relay(self, message_id: uuid.UUID) -> None:
        try:
            reply, request = await sync_to_async(_load_reply)(message_id)
        except Message.DoesNotExist:
            return
        reply.model = request.model or await get_client().default_model()
        METRICS.relay_started()
        try:
            await apublish(
                reply.conversation_id,
                "message.start",
                {"message_id": str(message_id), "model": reply.model},
            )
            outcome = await self._stream(reply, request)
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

    async def _stream(self, reply: Reply, request: ChatRequest):
        """Returns "cancelled", None (the stream ended) or the InferenceError that ended it."""
        pump = asyncio.create_task(self._pump(reply, request))
        publisher = asyncio.create_task(self._publisher(reply))
        stop = asyncio.create_task(self._wait_for_stop(reply.message_id))
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
            return "cancelled"
        error = results[0]
        if isinstance(error, BaseException):
            if isinstance(error, InferenceError):
                return error
            raise error
        return None

    async def _pump(self, reply: Reply, request: ChatRequest) -> None:
        try:
            async with contextlib.aclosing(get_client().stream_chat(request)) as stream:
                async for item in stream:
                    if isinstance(item, Delta):
                        if reply.ttft is None:
                            reply.ttft = time.monotonic() - reply.started
                        reply.deltas += 1
                        reply.produced_at = item.produced_at
                        reply.buffer.append(item.text)
                        reply.wake.set()
                    elif isinstance(item, Finish):
                        reply.finish = item
        finally:
            reply.done = True
            reply.wake.set()

    async def _publisher(self, reply: Reply) -> None:
        while True:
            await reply.wake.wait()
            reply.wake.clear()
            if reply.buffer:
                text = "".join(reply.buffer)
                reply.buffer.clear()
                await self._emit_token(reply, text)
            if reply.done and not reply.buffer:
                return

    async def _emit_token(self, reply: Reply, text: str) -> None:
        data = {"message_id": str(reply.message_id), "seq": reply.seq, "text": text}
        if settings.RELAY_EVENT_TIMESTAMPS and reply.produced_at is not None:
            data["produced_at"] = reply.produced_at
        await apublish(reply.conversation_id, "token", data)
        reply.parts.append(text)
        reply.seq += 1
        self.unsaved[reply.message_id] = reply
        METRICS.token_event(reply.produced_at)

    async def _stop_receiver(self) -> None:
        layer = get_channel_layer()
        self.stop_channel = await layer.new_channel()
        self.stop_channel_ready.set()
        while True:
            try:
                message = await layer.receive(self.stop_channel)
            except Exception:
                logger.warning("receiving Stop signals failed; retrying", exc_info=True)
                METRICS.failure("stop_channel")
                await asyncio.sleep(STOP_POLL_SECONDS)
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.stop_events[uuid.UUID(message["message_id"])].set()

    async def _wait_for_stop(self, message_id: uuid.UUID) -> None:
        """Returns only when the user pressed Stop (a signal through the channel layer, or
        the row's flag for a Stop sent before we listened)."""
        stopped = self.stop_events[message_id] = asyncio.Event()
        layer = get_channel_layer()
        await self.stop_channel_ready.wait()
        try:
            try:
                await layer.group_add(stop_group(message_id), self.stop_channel)
                listening = True
            except Exception:
                logger.warning("cannot listen for Stop of %s; watching the database", message_id,
                               exc_info=True)
                METRICS.failure("stop_channel")
                listening = False
            while not await _stop_flagged(message_id):
                if listening:
                    await stopped.wait()
                    return
                await asyncio.sleep(STOP_POLL_SECONDS)
        finally:
            self.stop_events.pop(message_id, None)
            with contextlib.suppress(Exception):
                await layer.group_discard(stop_group(message_id), self.stop_channel)

    async def _finish(self, reply: Reply, outcome) -> None:
        self.unsaved.pop(reply.message_id, None)
        fields, event, data = _final_state(reply, outcome)
        METRICS.reply_finished(fields["status"], getattr(outcome, "kind", None))
        await self._save_final(reply.message_id, fields)
        await apublish(reply.conversation_id, event, data)

    async def _save_final(self, message_id: uuid.UUID, fields: dict) -> None:
        """Retried, because a reply's final text must not be lost to a brief lock."""
        for attempt in range(FINAL_WRITE_ATTEMPTS):
            try:
                await sync_to_async(services.reply_finish)(message_id=message_id, fields=fields)
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
            await sync_to_async(services.reply_flush)(contents=batch, alive=alive)
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
            eventlog.forget_idle_channels(IDLE_CHANNEL_SECONDS)
            await asyncio.sleep(SWEEP_INTERVAL)

    async def sweep(self) -> None:
        orphans = await sync_to_async(services.replies_interrupt_orphans)(
            stale_after=settings.RELAY_STALE_AFTER, exclude=set(self.relays)
        )
        for message in orphans:
            await apublish(
                message.conversation_id,
                "message.error",
                message_error_data(message.id, message.error, message.retryable),
            )


async def _learn_default_model() -> None:
    """Ask the inference server its model once at start, not during the first reply."""
    try:
        await get_client().default_model()
    except Exception:  # the server may be down now; the first reply asks again
        logger.info("the inference server did not say its model yet", exc_info=True)


async def _stop_flagged(message_id: uuid.UUID) -> bool:
    try:
        return await Message.objects.filter(pk=message_id, stop_requested=True).aexists()
    except DatabaseError:
        return False


def _detached_task(loop, coro, name=None) -> asyncio.Task:
    """A task that outlives the request that started it: it must not inherit the request's
    context, whose thread executor for sync_to_async closes with the response."""
    return loop.create_task(coro, name=name, context=contextvars.Context())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _load_reply(message_id: uuid.UUID) -> tuple[Reply, ChatRequest]:
    message = Message.objects.select_related("conversation", "reply_to").get(
        pk=message_id, status=Message.Status.STREAMING
    )
    request = prompt.build_request(message)
    reply = Reply(message_id=message.id, conversation_id=message.conversation_id, model="")
    return reply, request


def _final_state(reply: Reply, outcome) -> tuple[dict, str, dict]:
    duration = time.monotonic() - reply.started
    usage = reply.finish.usage if reply.finish else {}
    completion_tokens = usage.get("completion_tokens") or reply.deltas
    fields = {
        "content": reply.content,
        "next_seq": reply.seq,
        "ttft_ms": None if reply.ttft is None else round(reply.ttft * 1000),
        "duration_ms": round(duration * 1000),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": completion_tokens,
        "model": reply.model,
    }
    if isinstance(outcome, InferenceError):
        fields.update(status=Message.Status.FAILED, error=outcome.message, retryable=outcome.retryable)
        return fields, "message.error", message_error_data(
            reply.message_id, outcome.message, outcome.retryable
        )
    if outcome == "cancelled":
        fields.update(status=Message.Status.CANCELLED, finish_reason="cancelled")
    else:
        reason = reply.finish.reason if reply.finish else "stop"
        fields.update(status=Message.Status.COMPLETE, finish_reason=reason)
    tokens_per_second = _tokens_per_second(completion_tokens, reply.ttft, duration)
    return fields, "message.end", {
        "message_id": str(reply.message_id),
        "finish_reason": fields["finish_reason"],
        "usage": {
            "prompt_tokens": fields["prompt_tokens"],
            "completion_tokens": completion_tokens,
        },
        "ttft_ms": fields["ttft_ms"],
        "tokens_per_second": tokens_per_second,
        "model": reply.model,
    }


def _tokens_per_second(tokens: int, ttft: float | None, duration: float) -> float | None:
    if ttft is None or tokens < 2 or duration <= ttft:
        return None
    return round((tokens - 1) / (duration - ttft), 1)


relay_manager = RelayManager()
