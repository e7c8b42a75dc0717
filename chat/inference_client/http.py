"""Streams replies from OpenAI-compatible servers (ours, vLLM, TGI, llama.cpp, Ollama): least
in-flight server first, another server tried only before the first token. Reply streams go
through transport.py's lean client; model lists through httpx."""

import asyncio
import json
import logging
import re
import time
import weakref

import httpx
from django.conf import settings

from chat.inference_client.base import (
    ChatRequest,
    Delta,
    Finish,
    InferenceClient,
    InferenceError,
    OnDelta,
    Progress,
)
from chat.inference_client.transport import StreamResponse, open_stream

logger = logging.getLogger(__name__)

UNREACHABLE = InferenceError(
    "The model server cannot be reached. It may be stopped or still starting.",
    retryable=True,
    kind="unavailable",
)
BUSY = InferenceError(
    "The model server is busy with other replies. Try again in a moment.",
    retryable=True,
    kind="busy",
)


class _TryNext(Exception):
    """This server cannot take the request now; another may."""

    def __init__(self, error: InferenceError):
        self.error = error


# The extension field that asks for the prompt's progress (INFERENCE_PROMPT_PROGRESS).
PROGRESS_FIELD = "return_progress"


class HttpInferenceClient(InferenceClient):
    def __init__(self) -> None:
        self.urls = [url.rstrip("/") for url in settings.INFERENCE_URLS]
        self.in_flight = {url: 0 for url in self.urls}
        # servers that refused PROGRESS_FIELD (a strict OpenAI-compatible API): not sent again
        self.without_progress: set[str] = set()
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.headers = {}
        if settings.INFERENCE_API_KEY:
            self.headers["Authorization"] = f"Bearer {settings.INFERENCE_API_KEY}"

    def _http(self) -> httpx.AsyncClient:
        """For everything but reply streams (see transport.py). One connection pool per
        event loop: tests and management commands run their own."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            timeout = httpx.Timeout(
                connect=settings.INFERENCE_CONNECT_TIMEOUT, read=None, write=30, pool=30
            )
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
            client = httpx.AsyncClient(headers=self.headers, timeout=timeout, limits=limits)
            self._clients[loop] = client
        return client

    def _by_load(self) -> list[str]:
        return sorted(self.urls, key=lambda url: self.in_flight[url])

    async def stream_chat(self, request: ChatRequest, on_delta: OnDelta | None = None):
        fields = request_body(request)
        body = json.dumps(fields).encode()
        deadline = time.monotonic() + settings.INFERENCE_BUSY_RETRY_SECONDS
        backoff = 0.25
        while True:
            last_error = UNREACHABLE
            for url in self._by_load():
                try:
                    async for item in self._stream_to(url, fields, body, on_delta):
                        yield item
                    return
                except _TryNext as skip:
                    last_error = skip.error
            if last_error is not BUSY or time.monotonic() + backoff > deadline:
                raise last_error
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 4.0)

    async def _stream_to(self, url: str, fields: dict, body: bytes, on_delta: OnDelta | None):
        """The reply from `url`: asked with `body` (`fields` encoded), or without
        PROGRESS_FIELD where the server refused that field, then and from then on (the
        history encoded again only then). A server refuses a request before any item, so
        nothing was yielded when it is asked again."""
        if PROGRESS_FIELD in fields and url in self.without_progress:
            body = _without_progress(fields)
        elif PROGRESS_FIELD in fields:
            try:
                async for item in self._stream_from(url, body, on_delta):
                    yield item
                return
            except InferenceError as error:
                if error.kind != "refused" or PROGRESS_FIELD not in error.message:
                    raise
                logger.warning("%s refused %s: asking it without from now on", url, PROGRESS_FIELD)
                self.without_progress.add(url)
                body = _without_progress(fields)
        async for item in self._stream_from(url, body, on_delta):
            yield item

    async def _stream_from(self, url: str, body: bytes, on_delta: OnDelta | None):
        self.in_flight[url] += 1
        started = False
        response = None
        try:
            try:
                async with asyncio.timeout(settings.INFERENCE_CONNECT_TIMEOUT):
                    response = await open_stream(f"{url}/v1/chat/completions", body, self.headers)
            except (OSError, TimeoutError) as exc:
                logger.warning("inference server %s unreachable: %s", url, exc)
                raise _TryNext(UNREACHABLE) from exc
            try:
                await _raise_for_status(response)
                async for item in _parse_stream(response, on_delta):
                    started = True
                    yield item
            finally:
                response.close()
        except OSError as exc:
            if not started and not (response and response.handed):
                raise _TryNext(UNREACHABLE) from exc
            raise _dropped() from exc
        finally:
            self.in_flight[url] -= 1

    async def list_models(self) -> list[dict]:
        for url in self._by_load():
            try:
                response = await self._http().get(f"{url}/v1/models", timeout=5)
                response.raise_for_status()
                return response.json().get("data", [])
            except (httpx.HTTPError, ValueError):
                continue
        return []

    async def aclose(self) -> None:
        for client in list(self._clients.values()):
            await client.aclose()
        self._clients.clear()


def _without_progress(fields: dict) -> bytes:
    return json.dumps({k: v for k, v in fields.items() if k != PROGRESS_FIELD}).encode()


def request_body(request: ChatRequest) -> dict:
    body = {
        "messages": request.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if settings.INFERENCE_PROMPT_PROGRESS:
        body[PROGRESS_FIELD] = True
    if request.model:
        body["model"] = request.model
    for name in ("max_tokens", "temperature", "top_p"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    body.update({name: value for name, value in request.sampling.items() if value is not None})
    return body


def _dropped() -> InferenceError:
    return InferenceError(
        "The connection to the model server was lost in the middle of the reply.",
        retryable=True,
        kind="dropped",
    )


async def _raise_for_status(response: StreamResponse) -> None:
    if response.status < 400:
        return
    body = await response.read_body()
    if response.status == 503:
        raise _TryNext(BUSY)
    detail = _error_message(body, response.status)
    if response.status == 401:
        raise InferenceError(
            "The site is not allowed to use the model server (check INFERENCE_API_KEY).",
            retryable=False,
            kind="auth",
        )
    if response.status == 404:
        raise InferenceError(
            f"The model server does not have this model: {detail}", retryable=False, kind="model"
        )
    if response.status == 429:
        raise InferenceError(
            "The model server is rate limiting requests. Try again in a moment.",
            retryable=True,
            kind="rate_limited",
        )
    if 400 <= response.status < 500:
        raise InferenceError(
            f"The model server refused this request: {detail}", retryable=False, kind="refused"
        )
    raise _TryNext(
        InferenceError(
            f"The model server failed ({response.status}): {detail}",
            retryable=True,
            kind="upstream",
        )
    )


def _error_message(body: bytes, status: int) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or f"HTTP {status}"


# One piece of text, as our server (json.dumps' spacing) and vLLM-like servers (compact)
# write it: exactly these keys in this order, one choice, no finish reason, usage or error.
# Matched whole, its text and timestamp are all the relay needs, read without building the
# chunk's dicts (json.loads and the lookups were a tenth of the site's CPU per token);
# any other chunk (another shape or spacing, a name with an escape) goes through json.loads.
_NAME = rb'"[\x20\x21\x23-\x5b\x5d-\x7e]*"'  # printable ASCII, no quote or backslash
_NUMBER = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_TEXT_CHUNK = re.compile(
    rb'\{"id": ?' + _NAME + rb', ?"object": ?"chat\.completion\.chunk", ?"created": ?'
    rb"(?:0|[1-9][0-9]*), ?"
    rb'"model": ?' + _NAME + rb", ?"
    rb'(?:"system_fingerprint": ?(?:null|' + _NAME + rb"), ?)?"
    rb'"choices": ?\[\{"index": ?0, ?"delta": ?\{(?:"role": ?"assistant", ?)?'
    rb'"content": ?"((?:[^"\\\x00-\x1f]|\\.)*)"\}, ?"logprobs": ?null, ?'
    rb'"finish_reason": ?null\}\]'
    rb'(?:, ?"x_ts": ?(?:null|(' + _NUMBER + rb")))?\}"
)


def _text_chunk(payload: bytes) -> tuple[str, float | int | None] | None:
    """(text, x_ts) of a chunk of _TEXT_CHUNK's shape, exactly what json.loads would give
    (a JSON number without a fraction or exponent is an int); None for any other chunk."""
    match = _TEXT_CHUNK.fullmatch(payload)
    if match is None:
        return None
    raw, stamp = match.group(1, 2)
    if b"\\" in raw:
        text = json.loads(b'"' + raw + b'"')  # escapes; json's errors are its errors
    else:
        text = raw.decode("utf-8", "surrogatepass")  # as json.loads decodes bytes
    if stamp is not None:
        stamp = float(stamp) if stamp.strip(b"-0123456789") else int(stamp)
    return text, stamp


def _progress(chunk: dict) -> Progress | None:
    """A `prompt_progress` chunk's figures; None for any other chunk, or one whose figures
    are not counts (a server's extension: nothing to fail the reply over)."""
    figures = chunk.get("prompt_progress")
    if not isinstance(figures, dict):
        return None
    counts = [figures.get(name) for name in ("processed", "total", "cache")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return None
    processed, total, cached = counts
    return Progress(min(processed, total), total, min(cached, total)) if total else None


async def _parse_stream(response: StreamResponse, on_delta: OnDelta | None = None):
    """Delta per content chunk, then one Finish; the usage chunk may come after the
    finish_reason, so Finish waits for [DONE]. With on_delta, a plain text chunk that
    arrives while nothing waits before it goes to on_delta from the connection's read
    instead: no task wakes for it, and it passes up through none of the generators
    (bench.relay_ab at 200 streams: 0.954x the site's CPU per relayed token)."""
    finish_reason = None
    usage: dict = {}
    loop = asyncio.get_running_loop()
    read_timeout = settings.INFERENCE_READ_TIMEOUT
    # Moving the deadline replaces a timer: for every chunk that was a visible part of the
    # relay's CPU. It moves only once it lags by more than `slack`, so the silence that
    # ends a reply is between read_timeout - slack and read_timeout.
    slack = min(1.0, read_timeout / 32)
    first_wait = settings.INFERENCE_FIRST_TOKEN_TIMEOUT
    texts = 0  # Deltas yielded here (those handed to on_delta count in response.handed)
    try:
        async with asyncio.timeout(first_wait) as deadline:

            def waited() -> None:
                """Before the first text, a chunk without any (a long prompt's progress, a
                role-only first chunk) gives the server another first-token wait, never
                less than it had left: read_timeout is for silences between pieces of text."""
                due = loop.time() + first_wait
                if due > deadline.when() and not deadline.expired():
                    deadline.reschedule(due)

            def moved() -> None:
                due = loop.time() + read_timeout
                late = due - deadline.when() > slack or due < deadline.when()
                if late and not deadline.expired():  # else a read in the timeout's last turn
                    deadline.reschedule(due)

            def hand(payload: bytes) -> bool:
                try:
                    known = _text_chunk(payload)
                except ValueError:
                    return False  # read again below, where it is a protocol error
                if known is None:
                    return False
                moved()
                if known[0]:
                    response.handed += 1
                    on_delta(*known)
                return True

            if on_delta is not None:
                response.protocol.fast = hand
            async for payload in response.sse_data():
                if payload == b"[DONE]":
                    yield Finish(finish_reason or "stop", usage)
                    return
                known = _text_chunk(payload)
                if known is not None:
                    if known[0]:
                        texts += 1
                        yield Delta(*known)
                else:
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise InferenceError(
                            "The model server failed while writing the reply: "
                            f"{chunk['error'].get('message', 'unknown error')}",
                            retryable=True,
                            kind="upstream",
                        )
                    usage = chunk.get("usage") or usage
                    if progress := _progress(chunk):
                        yield progress
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            texts += 1
                            yield Delta(text, chunk.get("x_ts"))
                        finish_reason = choice.get("finish_reason") or finish_reason
                if texts or response.handed:
                    moved()
                else:
                    waited()
    except TimeoutError as exc:
        raise InferenceError(
            "The model server stopped answering: no new text for too long.",
            retryable=True,
            kind="timeout",
        ) from exc
    except ValueError as exc:
        raise InferenceError(
            "The model server sent something that is not a chat stream.",
            retryable=False,
            kind="protocol",
        ) from exc
    finally:
        response.protocol.fast = None
    raise _dropped()
