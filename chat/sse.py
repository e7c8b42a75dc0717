"""The conversation event stream, served as a plain ASGI app instead of a Django view.

django-eventstream's view runs inside Django's ASGI handler, which gives every request its
own thread for sync code and keeps it until the response ends: one idle OS thread per open
event stream (measured: 200 streams, 202 threads). Here the same django-eventstream machinery
(its storage, listener manager and `stream()` generator) is driven from an ASGI app, so an
idle stream costs a coroutine, not a thread. Its few sync calls go to a shared thread.
"""

import asyncio
import contextlib
import logging
from urllib.parse import parse_qs, unquote

from channels.db import database_sync_to_async
from django_eventstream.eventrequest import EventRequest
from django_eventstream.utils import parse_last_event_id
from django_eventstream.views import Listener, stream

from chat import delivery
from chat.events import channel_for
from chat.relay_metrics import METRICS
from chat.selectors import conversation_readable_by

logger = logging.getLogger(__name__)

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


async def plain_response(send, status: int, text: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    await send({"type": "http.response.body", "body": text.encode()})


def last_event_ids(scope, channel: str) -> dict:
    """The ids to resume from: the Last-Event-ID header, or ?lastEventId= (for clients
    that cannot set headers)."""
    headers = dict(scope.get("headers") or [])
    raw = headers.get(b"last-event-id", b"").decode("latin-1")
    if not raw:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        raw = next((v for v in reversed(query.get("lastEventId", [])) if v), "")
    if not raw:
        return {}
    if raw == "error":
        raise ValueError("Can't resume after stream-error")
    parsed = {unquote(name): value for name, value in parse_last_event_id(raw).items()}
    return {channel: parsed[channel]} if channel in parsed else {}


class ConversationEvents:
    """GET /events/conversations/<uuid>/ for the conversation's owner (and staff)."""

    async def __call__(self, scope, receive, send):
        user = scope.get("user")
        conversation_id = scope["url_route"]["kwargs"]["conversation_id"]
        if user is None or not user.is_authenticated:
            return await plain_response(send, 403, "Sign in first.\n")
        readable = await database_sync_to_async(conversation_readable_by)(
            user=user, conversation_id=conversation_id
        )
        if not readable:
            return await plain_response(send, 404, "No such conversation.\n")
        channel = channel_for(conversation_id)
        try:
            last_ids = last_event_ids(scope, channel)
        except (ValueError, KeyError):
            return await plain_response(send, 400, "Invalid Last-Event-ID.\n")
        if last_ids:
            METRICS.reconnects.inc()
        try:
            await delivery.ready()
        except TimeoutError:
            return await plain_response(send, 503, "Event delivery is not available.\n")
        await self.stream(user, channel, last_ids, receive, send)

    async def stream(self, user, channel, last_ids, receive, send):
        request = EventRequest()
        request.channels = {channel}
        request.channel_last_ids = last_ids
        request.is_next = False
        request.user = user
        listener = Listener()
        listener.user_id = user.pk
        listener.channels = request.channels
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        pump = asyncio.ensure_future(self.pump(stream(request, listener), send))
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

    async def pump(self, events, send) -> None:
        try:
            async for body in events:
                await send({"type": "http.response.body", "body": body.encode(), "more_body": True})
        finally:
            await events.aclose()


async def wait_for_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
