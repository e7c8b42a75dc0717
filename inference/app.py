"""The HTTP API (FastAPI). ``create_app(settings)`` builds one app with its own engine and
metrics registry; the engine starts and stops with the app's lifespan."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inference.engine import (
    ContextLengthExceeded,
    Engine,
    Generation,
    InvalidParams,
    Message,
    NotReady,
)
from inference.engine_factory import create_engine
from inference.limits import BodyLimit
from inference.metrics import Metrics
from inference.sampling_params import TokenLogprob
from inference.scheduler import ErrorEvent, FinishEvent, ProgressEvent, QueueFull, TokenEvent
from inference.schemas import ChatCompletionRequest, ModelCard, ModelList
from inference.settings import Settings
from inference.wire import DONE, ChunkMaker, completion, error_body, sse

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.headers = (
            status,
            message,
            type_,
            code,
            headers,
        )
        self.param = param  # the request field at fault, as OpenAI names it


def _error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(
        error_body(err.message, err.type, err.code, err.param), err.status, headers=err.headers
    )


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    settings = settings or Settings()
    engine = engine or create_engine(settings)
    metrics = Metrics(
        lambda: engine.running, lambda: engine.waiting, engine.cache_stats, engine.step_times
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title="tokenstream inference", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.state.engine, app.state.settings, app.state.metrics = engine, settings, metrics
    _install_error_handlers(app)
    auth = _auth_dependency(settings)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if engine.ready:
            return JSONResponse({"status": "ready", "model": engine.model_name})
        status = "failed" if engine.load_error else "loading"
        body = {"status": status, "model": engine.model_name, "error": engine.load_error}
        return JSONResponse(body, 503, headers={"Retry-After": str(settings.retry_after_seconds)})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models() -> ModelList:
        n = engine.context_length
        card = ModelCard(
            id=engine.model_name, created=int(time.time()), context_length=n, max_model_len=n
        )
        return ModelList(data=[card])

    @app.post("/v1/chat/completions", dependencies=[Depends(auth)], response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        gen = await _submit(engine, settings, metrics, body)
        run = _Run(gen, engine.model_name, metrics, arrival, logprobs=bool(body.logprobs))
        if body.stream:
            return StreamingResponse(
                run.stream(body.include_usage()),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        return await _unless_gone(request, run.collect(), lambda: engine.cancel(gen.request_id))

    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        # OpenAI (and the site relay) expect 400 for a bad body, not FastAPI's 422.
        errors = exc.errors()
        parts = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
            for e in errors
        ]
        fields = [p for p in (errors[0].get("loc", ()) if errors else ()) if p != "body"]
        return _error_response(
            ApiError(
                400,
                "; ".join(parts) or "invalid request body",
                "invalid_request_error",
                "invalid_request",
                param=str(fields[0]) if fields else None,
            )
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error_response(
            ApiError(exc.status_code, str(exc.detail), type_, None, dict(exc.headers or {}))
        )


def _auth_dependency(settings: Settings) -> Any:
    key = settings.inference_api_key

    async def check(request: Request) -> None:
        if not key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), key.encode()
        ):
            raise ApiError(
                401,
                "Invalid or missing API key (Authorization: Bearer <key>).",
                "authentication_error",
                "invalid_api_key",
                {"WWW-Authenticate": "Bearer"},
            )

    return check


async def _unless_gone(request: Request, answer, cancel) -> Response:
    """A non-streaming answer, whose generation is cancelled (its slot freed at the next
    step) if the client leaves first: nobody would read it."""
    waiting = asyncio.ensure_future(answer)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            cancel()
        return await waiting
    finally:
        gone.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _submit(
    engine: Engine, settings: Settings, metrics: Metrics, body: ChatCompletionRequest
) -> Generation:
    if body.model and body.model != engine.model_name:
        metrics.requests.labels("rejected").inc()
        raise ApiError(
            404,
            f"The model '{body.model}' does not exist; this server serves '{engine.model_name}'.",
            "not_found_error",
            "model_not_found",
        )
    refused = body.refused()
    if refused is not None:
        metrics.requests.labels("rejected").inc()
        param, code, message = refused
        raise ApiError(400, message, "invalid_request_error", code, param=param)
    params = body.sampling(body.token_limit() or engine.context_length)
    messages = [Message(m.role, m.text()) for m in body.messages]
    retry = {"Retry-After": str(settings.retry_after_seconds)}
    try:
        return await engine.asubmit(messages, params)
    except ContextLengthExceeded as exc:
        metrics.requests.labels("rejected").inc()
        raise ApiError(400, str(exc), "invalid_request_error", "context_length_exceeded") from exc
    except InvalidParams as exc:
        metrics.requests.labels("rejected").inc()
        raise ApiError(
            400, str(exc), "invalid_request_error", "invalid_value", param=exc.param
        ) from exc
    except QueueFull as exc:
        metrics.requests.labels("overloaded").inc()
        raise ApiError(
            503, f"{exc}; retry later.", "server_overloaded", "server_overloaded", retry
        ) from exc
    except NotReady as exc:
        metrics.requests.labels("overloaded").inc()
        raise ApiError(
            503, f"Model not ready: {exc}", "server_not_ready", "model_not_ready", retry
        ) from exc


class _Run:
    """Turns one Generation into an SSE stream or a JSON completion, recording metrics."""

    def __init__(
        self, gen: Generation, model: str, metrics: Metrics, arrival: float, logprobs: bool
    ) -> None:
        self.gen, self.metrics, self.arrival = gen, metrics, arrival
        self.maker = ChunkMaker(gen.request_id, model)
        self.model = model
        self.logprobs = logprobs
        self._last_ts: float | None = None
        self._counted = 0

    def _on_tokens(self, ev: TokenEvent) -> None:
        if self._last_ts is None:
            self.metrics.ttft.observe(max(0.0, ev.ts - self.arrival))
        else:
            self.metrics.itl.observe(max(0.0, ev.ts - self._last_ts))
        self._last_ts = ev.ts
        self._counted += ev.tokens
        self.metrics.tokens.inc(ev.tokens)

    def _asked(self, entries: tuple[TokenLogprob, ...]) -> tuple[TokenLogprob, ...] | None:
        return entries if self.logprobs else None

    def _on_end(self, ev: FinishEvent) -> None:
        self.metrics.tokens.inc(max(0, ev.completion_tokens - self._counted))
        self.metrics.requests.labels("cancelled" if ev.reason == "cancelled" else "ok").inc()

    async def stream(self, include_usage: bool) -> AsyncIterator[bytes]:
        outcome_set = False
        try:
            async for ev in self.gen:
                if isinstance(ev, TokenEvent):
                    self._on_tokens(ev)
                    yield sse(self.maker.delta(ev.text, ev.ts, self._asked(ev.logprobs)))
                elif isinstance(ev, FinishEvent):
                    outcome_set = True
                    self._on_end(ev)
                    for chunk in self._final_chunks(ev, include_usage):
                        yield chunk
                elif isinstance(ev, ProgressEvent):
                    yield sse(self._progress(ev))
                else:
                    outcome_set = True
                    self.metrics.requests.labels("error").inc()
                    yield sse(error_body(ev.message, "server_error", "generation_failed"))
                    return  # the stream ends after the error chunk
        except (asyncio.CancelledError, GeneratorExit):
            outcome_set = True
            self.metrics.requests.labels("disconnected").inc()
            raise
        except Exception as exc:  # noqa: BLE001 - never a 500 once streaming began
            outcome_set = True
            self.metrics.requests.labels("error").inc()
            yield sse(error_body(f"internal error: {exc}", "server_error", "internal_error"))
        finally:
            if not outcome_set:
                self.metrics.requests.labels("disconnected").inc()
            await self.gen.aclose()  # frees the slot if the client went away

    def _progress(self, ev: ProgressEvent) -> dict:
        spent = round(max(0.0, ev.ts - self.arrival) * 1000)
        return self.maker.progress(ev.total, ev.cached, ev.processed, spent, ev.ts)

    def _final_chunks(self, ev: FinishEvent, include_usage: bool) -> list[bytes]:
        out: list[bytes] = []
        tail = self._asked(ev.logprobs)
        if ev.text:
            out.append(sse(self.maker.delta(ev.text, ev.ts, tail)))
            tail = None
        if ev.reason == "cancelled":
            out.append(sse(error_body("request cancelled", "cancelled", "cancelled")))
            return out
        out.append(sse(self.maker.finish(ev.reason, ev.ts, tail)))
        if include_usage:
            out.append(sse(self.maker.usage(ev.prompt_tokens, ev.completion_tokens, ev.ts)))
        out.append(DONE)
        return out

    async def collect(self) -> JSONResponse:
        parts: list[str] = []
        logprobs: list[TokenLogprob] = []
        try:
            async for ev in self.gen:
                if isinstance(ev, TokenEvent | FinishEvent):
                    parts.append(ev.text)
                    logprobs.extend(ev.logprobs)
                if isinstance(ev, TokenEvent):
                    self._on_tokens(ev)
                elif isinstance(ev, FinishEvent):
                    self._on_end(ev)
                    body = completion(
                        self.gen.request_id,
                        self.model,
                        "".join(parts),
                        "stop" if ev.reason == "cancelled" else ev.reason,
                        ev.prompt_tokens,
                        ev.completion_tokens,
                        self._asked(tuple(logprobs)),
                    )
                    return JSONResponse(body)
                elif isinstance(ev, ErrorEvent):
                    self.metrics.requests.labels("error").inc()
                    return _error_response(
                        ApiError(500, ev.message, "server_error", "generation_failed")
                    )
        finally:
            await self.gen.aclose()
        return _error_response(ApiError(500, "generation ended unexpectedly", "server_error"))
