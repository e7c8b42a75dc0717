"""The site's own OpenAI-compatible API, for a user's API key: POST /v1/chat/completions
(streaming or not) and GET /v1/models.

Each call becomes a conversation of the key's owner (source `api`), sent through the same
service as the page, so the same per-user limits and quotas apply, and the reply is relayed,
saved and counted like any other. This view reads the reply from the relay in this process
(relay_manager.tap) and writes it in OpenAI's format. Only the key authenticates here: no
session, no CSRF; and a key opens nothing but these paths.

Answers start once the reply's first text (or its failure) is known, so that a failure
before any text, where the inference pool has already tried every server, is a plain HTTP
error the client understands rather than a broken stream.
"""

import asyncio
import functools
import time

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from chat import keys, services
from chat.inference_client import get_client
from chat.models import Message
from chat.openai_wire import (
    DONE,
    Completion,
    WireError,
    chunk_json,
    completion_json,
    finish_reason,
    model_json,
    parse_request,
    reply_failed,
    sse,
    usage_chunk_json,
)
from chat.relay.manager import relay_manager

# How long a reader waits on the relay before checking the database: covers a reply that
# ended before the reader tapped it, or whose relay never started.
IDLE_CHECK_SECONDS = 2.0
FAILED = {Message.Status.FAILED, Message.Status.INTERRUPTED}
_stopping: set[asyncio.Task] = set()


def error_response(exc: WireError) -> JsonResponse:
    response = JsonResponse(exc.body(), status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def _bearer(request) -> str:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return secret.strip() if scheme.lower() == "bearer" else ""


async def _authenticate(request):
    secret = _bearer(request)
    if not secret:
        raise WireError(
            401,
            "You didn't provide an API key. Send it as the header "
            "`Authorization: Bearer ts-…`; create one in the chat's settings.",
            code="invalid_api_key",
        )
    user = await sync_to_async(keys.user_for_secret)(secret)
    if user is None:
        raise WireError(
            401, "Incorrect API key provided: it is unknown or was revoked.", code="invalid_api_key"
        )
    return user


def openai_view(*methods: str):
    """Key auth, the method check and every refusal in OpenAI's error shape."""

    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            try:
                if request.method not in methods:
                    raise WireError(405, f"Use {' or '.join(methods)} on {request.path}.")
                user = await _authenticate(request)
                return await view(request, user, *args, **kwargs)
            except WireError as exc:
                return error_response(exc)

        return wrapper

    return decorate


# --- models --------------------------------------------------------------------------


@openai_view("GET")
async def models(request, user):
    data = [model_json(m) for m in await get_client().list_models()]
    return JsonResponse({"object": "list", "data": data})


@openai_view("GET")
async def model_detail(request, user, model_id: str):
    for model in await get_client().list_models():
        if model.get("id") == model_id:
            return JsonResponse(model_json(model))
    raise WireError(
        404, f"The model `{model_id}` does not exist.", code="model_not_found", param="model"
    )


@csrf_exempt
def not_found(request, rest: str = ""):
    return error_response(WireError(404, f"Unknown path: {request.path}.", type="not_found_error"))


# --- chat completions ----------------------------------------------------------------


def _refusal(exc: services.ServiceError) -> WireError:
    if isinstance(exc, services.QuotaExceeded):
        wait = max(1, int((exc.resets_at - timezone.now()).total_seconds()))
        return WireError(
            429,
            exc.message,
            type="insufficient_quota",
            code="insufficient_quota",
            headers={"Retry-After": str(wait)},
        )
    if isinstance(exc, services.RateLimited):
        return WireError(
            429,
            exc.message,
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": "1"},
        )
    return WireError(400, exc.message)


@openai_view("POST")
async def chat_completions(request, user):
    try:
        body = request.body
    except RequestDataTooBig:
        raise WireError(413, "The request is larger than 1 MiB.") from None
    call = parse_request(body)
    try:
        sent = await sync_to_async(services.conversation_start_from_api)(
            owner=user,
            system_prompt=call.system_prompt,
            turns=call.turns,
            settings_=call.conversation,
        )
    except services.ServiceError as exc:
        raise _refusal(exc) from None
    feed = ReplyFeed(sent.assistant_message)
    try:
        item = await feed.next()
        while not call.stream and item[0] != "end":
            item = await feed.next()
        kind, payload = item
        if kind == "end" and (not call.stream or payload["fields"]["status"] in FAILED):
            return _final_answer(feed, payload)
    except BaseException:  # the caller went away (cancelled), or this view failed
        feed.close(ended=False)
        raise
    stream = _chunks(feed, item, include_usage=call.include_usage)
    return StreamingHttpResponse(
        stream,
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _final_answer(feed: "ReplyFeed", end: dict) -> JsonResponse:
    feed.close(ended=True)
    fields = end["fields"]
    if fields["status"] in FAILED:
        raise reply_failed(end.get("kind"), fields.get("error") or "The reply failed.")
    return JsonResponse(completion_json(feed.call(), fields))


async def _chunks(feed: "ReplyFeed", item: tuple, *, include_usage: bool):
    """The reply as OpenAI stream chunks: the role, the text as it comes, the finish, the
    usage when asked, [DONE]. A failure after the first text ends the stream with an
    error chunk and no [DONE], as OpenAI (and the inference server) do."""
    ended = False
    try:
        call = feed.call()
        yield sse(chunk_json(call, {"role": "assistant", "content": ""}, with_usage=include_usage))
        while True:
            kind, payload = item
            if kind == "token":
                yield sse(chunk_json(call, {"content": payload}, with_usage=include_usage))
                item = await feed.next()
                continue
            ended = True
            fields = payload["fields"]
            rest = feed.unsent(fields.get("content") or "")
            if rest:
                yield sse(chunk_json(call, {"content": rest}, with_usage=include_usage))
            if fields["status"] in FAILED:
                yield sse(reply_failed(payload.get("kind"), fields.get("error") or "").body())
                return
            reason = finish_reason(fields.get("finish_reason") or "")
            yield sse(chunk_json(call, {}, finish=reason, with_usage=include_usage))
            if include_usage:
                yield sse(usage_chunk_json(call, fields))
            yield DONE
            return
    finally:
        feed.close(ended=ended)


class ReplyFeed:
    """One reply read from the relay in this process, with the text handed out so far."""

    def __init__(self, reply: Message) -> None:
        self.reply = reply
        self.queue = relay_manager.tap(reply.id)
        self.model = reply.model
        self.created = int(time.time())
        self.sent = ""
        self.closed = False

    def call(self) -> Completion:
        return Completion(
            id=f"chatcmpl-{self.reply.id.hex}", created=self.created, model=self.model or "default"
        )

    async def next(self) -> tuple[str, object]:
        """The next ("token", text) or the ("end", {"fields", "kind"})."""
        while True:
            try:
                async with asyncio.timeout(IDLE_CHECK_SECONDS):
                    kind, payload = await self.queue.get()
            except TimeoutError:
                ended = await self._ended_in_database()
                if ended is None:
                    continue
                kind, payload = ended
            if kind == "start":
                self.model = payload.get("model") or self.model
                continue
            if kind == "end":  # a reply that ended before the tap gave no start
                self.model = payload["fields"].get("model") or self.model
            if kind == "token":
                self.sent += payload
            return kind, payload

    def unsent(self, content: str) -> str:
        """What the saved text holds beyond what was handed out (a reply read late)."""
        return content[len(self.sent) :] if content.startswith(self.sent) else ""

    async def _ended_in_database(self) -> tuple[str, dict] | None:
        reply_id = self.reply.id
        if reply_id in relay_manager.live or reply_id in relay_manager.relays:
            return None
        saved = (
            await Message.objects.filter(pk=reply_id)
            .values(
                "status",
                "content",
                "finish_reason",
                "prompt_tokens",
                "completion_tokens",
                "error",
                "model",
            )
            .afirst()
        )
        if saved is None:
            saved = {
                "status": Message.Status.FAILED,
                "content": self.sent,
                "error": "The conversation was deleted while the reply was written.",
            }
        elif saved["status"] == Message.Status.STREAMING:
            return None
        self.model = saved.get("model") or self.model
        return "end", {"fields": saved, "kind": None}

    def close(self, *, ended: bool) -> None:
        """Stop reading; a caller gone before the end stops the reply (frees its slot)."""
        if self.closed:
            return
        self.closed = True
        relay_manager.untap(self.reply.id, self.queue)
        if not ended:
            task = asyncio.get_running_loop().create_task(
                sync_to_async(services.reply_stop)(reply=self.reply)
            )
            _stopping.add(task)
            task.add_done_callback(_stopping.discard)
