"""The conversation event stream, served as a plain ASGI app instead of a Django view.

django-eventstream's view runs inside Django's ASGI handler, which gives every request its
own thread for sync code and keeps it until the response ends: one idle OS thread per open
event stream. Its stream loop also replays events twice when new ones arrive while it reads
the log (it re-reads from the ids it started with). Here a coroutine per stream keeps
django-eventstream's storage and wire format (through chat/streaming/eventstream.py) and
tracks the last id it sent: never a duplicate, and a gap (an event it was not told about)
sends it back to the log, where nothing is missing.
"""

import asyncio
import contextlib
import json
import logging
import time
from urllib.parse import parse_qs, unquote

from asgiref.sync import sync_to_async

from chat.relay.metrics import METRICS
from chat.streaming import delivery, slots
from chat.streaming.access import aconversation_readable_by, astream_may_continue
from chat.streaming.channels import channel_for
from chat.streaming.eventstream import EventDoesNotExist, Subscription, id_prefix, parse_resume_ids
from chat.streaming.eventstream import storage as event_storage
from chat.streaming.publish import local_delivery
from chat.streaming.socket_write import SocketWriter

logger = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 20
READ_BATCH = 500
STREAMS_RETRY_AFTER = 10
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
OPENING = ":" + " " * 2048 + "\n\nevent: stream-open\ndata:\n\n"


# The server's own `send`, kept in the scope by KeepServerSend.
SERVER_SEND = "tokenstream.server_send"


class KeepServerSend:
    """Outermost on the event stream's route: keeps the server's `send` in the scope.
    Channels' session middleware wraps `send` to save the session and set its cookie with
    the response's start; a stream's later messages (one per event, for as long as the page
    is open) merely pass through that wrapper, which reads the session for each. The
    stream's start still goes through the wrapper, its body straight to the server."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        return await self.app({**scope, SERVER_SEND: send}, receive, send)


async def plain_response(send, status: int, text: str, retry_after: int | None = None) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text.encode()})


def last_event_id(scope, channel: str) -> int | None:
    """The id to resume after: the Last-Event-ID header, or ?lastEventId= (for clients
    that cannot set headers)."""
    headers = dict(scope.get("headers") or [])
    raw = headers.get(b"last-event-id", b"").decode("latin-1")
    if not raw:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        raw = next((v for v in reversed(query.get("lastEventId", [])) if v), "")
    if not raw:
        return None
    parsed = {unquote(name): value for name, value in parse_resume_ids(raw).items()}
    return int(parsed[channel]) if channel in parsed else None


class ConversationEvents:
    """GET /events/conversations/<uuid>/ for the conversation's owner (and staff)."""

    async def __call__(self, scope, receive, send):
        user = scope.get("user")
        conversation_id = scope["url_route"]["kwargs"]["conversation_id"]
        if user is None or not user.is_authenticated:
            return await plain_response(send, 403, "Sign in first.\n")
        readable = await aconversation_readable_by(user=user, conversation_id=conversation_id)
        if not readable:
            return await plain_response(send, 404, "No such conversation.\n")
        channel = channel_for(conversation_id)
        try:
            resume_after = last_event_id(scope, channel)
        except (ValueError, KeyError):
            return await plain_response(send, 400, "Invalid Last-Event-ID.\n")
        if resume_after is not None:
            METRICS.reconnects.inc()
        refusal = slots.take(user.pk)
        if refusal is not None:
            return await plain_response(send, *refusal, retry_after=STREAMS_RETRY_AFTER)
        try:
            await self.stream(scope, receive, send, channel, resume_after)
        finally:
            slots.give_back(user.pk)

    async def stream(self, scope, receive, send, channel: str, resume_after: int | None):
        try:
            await delivery.ready()
        except TimeoutError:
            return await plain_response(send, 503, "Event delivery is not available.\n")
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        send = scope.get(SERVER_SEND, send)  # the body: see KeepServerSend
        write = SocketWriter.for_send(send)
        conversation_id = scope["url_route"]["kwargs"]["conversation_id"]

        async def still_allowed() -> bool:
            return await astream_may_continue(scope, conversation_id)

        events = ChannelStream(channel, scope["user"].pk, resume_after, still_allowed, write)
        events = events.bodies()
        pump = asyncio.ensure_future(forward(events, send, write))
        gone = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, gone):
                task.cancel()
            await asyncio.gather(pump, gone, return_exceptions=True)
        if pump.done() and not pump.cancelled():
            if pump.exception() is not None:
                logger.error("event stream of %s failed", channel, exc_info=pump.exception())
            # End the response, so the browser reconnects instead of waiting forever.
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})


class AccessEnded(Exception):
    """The session that opened the stream is gone, or may no longer read the channel."""


class ChannelStream:
    """One subscriber of one channel: catch up from the log, then follow live events."""

    def __init__(
        self,
        channel: str,
        user_id,
        resume_after: int | None,
        still_allowed,
        writer: SocketWriter | None = None,
    ):
        """writer: where a live event may be written the moment it is published, while the
        stream waits for it (`_sink`)."""
        self.channel = channel
        self.still_allowed = still_allowed
        self.checked_at = time.monotonic()
        self.id_prefix = id_prefix(channel)
        self.last_id = resume_after
        self.storage = event_storage()
        self.writer = writer
        sink = None if writer is None else self._sink
        self.subscription = Subscription(channel, user_id, sink)
        # The in-memory log answers in microseconds; Redis is a network round trip.
        self.local = local_delivery()

    async def _storage(self, method, *args, **kwargs):
        call = getattr(self.storage, method)
        if self.local:
            return call(*args, **kwargs)
        return await sync_to_async(call, thread_sensitive=False)(*args, **kwargs)

    def _encode(self, event) -> str:
        # Our event types and ids hold no newlines, and json.dumps writes none in data:
        # django-eventstream's sanitising regexes are not needed on this hot path.
        self.last_id = int(event.id)
        return f"event: {event.type}\nid: {self._id()}\ndata: {event.data}\n\n"

    def _sink(self, event) -> bool:
        """The next live event, written as it is published while `_follow` waits with
        nothing queued (Subscription.sink); False: it goes through the queue as ever (not
        the next id, or the socket's buffer is not empty)."""
        event_id = int(event.id)
        if event_id != self.last_id + 1:
            return False
        body = f"event: {event.type}\nid: {self.id_prefix}{event_id}\ndata: {event.data}\n\n"
        if not self.writer.write(body.encode()):
            return False
        self.last_id = event_id
        return True

    def _id(self) -> str:
        return f"{self.id_prefix}{self.last_id}"

    def _reset(self) -> str:
        data = json.dumps({"channels": [self.channel]})
        return f"event: stream-reset\nid: {self._id()}\ndata: {data}\n\n"

    async def bodies(self):
        if self.last_id is None:
            # Fixed before stream-open is sent: a client may act on stream-open (send a
            # message), and whatever is published after it must reach this stream.
            self.last_id = await self._storage("get_current_id", self.channel)
        self.subscription.open()
        try:
            yield OPENING
            while True:
                async for body in self._catch_up():
                    yield body
                async for body in self._follow():
                    yield body
        except AccessEnded:
            return
        finally:
            self.subscription.close()

    async def _catch_up(self):
        """Everything after last_id from the log; then drop what was queued meanwhile
        (it is in the log too, and the next read or _follow's id check covers it)."""
        while True:
            try:
                events = await self._storage(
                    "get_events", self.channel, self.last_id, limit=READ_BATCH
                )
            except EventDoesNotExist as exc:
                self.last_id = int(exc.current_id)
                yield self._reset()
                continue
            if events:
                yield "".join(self._encode(event) for event in events)
            if len(events) >= READ_BATCH:
                continue
            queued, overflow = self.subscription.take()
            if not queued and not overflow:
                return

    async def _follow(self):
        """Live events as they are published; back to the log on overflow or a gap."""
        while True:
            if not await self.subscription.wait(KEEP_ALIVE_SECONDS):
                await self._check_access()
                yield "event: keep-alive\ndata:\n\n"
                continue
            if time.monotonic() - self.checked_at >= KEEP_ALIVE_SECONDS:
                await self._check_access()  # a busy stream never reaches a keep-alive
            items, overflow = self.subscription.take()
            body = []
            for event in items:
                event_id = int(event.id)
                if event_id <= self.last_id:
                    continue  # already sent from the log
                if event_id != self.last_id + 1:
                    overflow = True  # missed one: the log has it
                    break
                body.append(self._encode(event))
            if body:
                yield "".join(body)
            if overflow:
                return

    async def _check_access(self) -> None:
        if not await self.still_allowed():
            raise AccessEnded
        self.checked_at = time.monotonic()


async def forward(bodies, send, writer: SocketWriter | None = None) -> None:
    """writer: straight to the socket when it can (chat/streaming/socket_write.py)."""
    try:
        async for body in bodies:
            data = body.encode()
            if writer is None or not writer.write(data):
                await send({"type": "http.response.body", "body": data, "more_body": True})
    finally:
        await bodies.aclose()


async def wait_for_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
