"""The engine: what the HTTP app talks to (submit, cancel, readiness).

Every engine shares the same scheduler, queue, back-pressure and cancellation path; a
subclass supplies only its Backend (how tokens are produced) and how a chat becomes prompt
tokens. `inference.engine_factory.create_engine` picks the subclass from Settings.engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from inference.sampling_params import SamplingParams
from inference.scheduler import ErrorEvent, Event, FinishEvent, Scheduler, Sequence, StepTimes
from inference.settings import Settings

log = logging.getLogger("inference.engine")


class NotReady(Exception):
    """The model is still loading or warming up."""


class ContextLengthExceeded(ValueError):
    """The prompt does not leave room for a single new token."""


class InvalidParams(ValueError):
    """A sampling parameter this engine cannot honour (a logit_bias token outside its vocabulary)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Message:
    role: str
    content: str


class Generation:
    """One submitted request: iterate it for events; leaving early cancels it."""

    def __init__(self, engine: Engine, seq: Sequence) -> None:
        self._engine = engine
        self._seq = seq
        self.request_id = seq.request_id
        self.prompt_tokens = len(seq.prompt_ids)
        self.max_tokens = seq.params.max_tokens
        self.created = time.monotonic()
        self.finished = False

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        try:
            while True:
                ev = await self._seq.queue.get()
                yield ev
                if isinstance(ev, FinishEvent | ErrorEvent):
                    self.finished = True
                    return
        finally:
            await self.aclose()
            self._engine._forget(self.request_id)

    async def aclose(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.cancel(self.request_id)

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _in_passing_thread(fn: Callable[[], Any]) -> Any:
    """fn() in a thread of its own, which ends with it.

    torch's OpenMP keeps a team of worker threads for each OS thread that ran a parallel op.
    Loaded in one of asyncio.to_thread's workers, which live on, the model left a team idle
    beside the model thread's, and on 2 cores every op of the model thread then took 1.4x
    (a 128-row matmul) to 2.5x (an elementwise op) as long: a 4,000-token prompt's chunked
    prefill 6.4 s instead of 3.5 s. A team whose thread has ended is gone."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if done.done():  # the boot was cancelled meanwhile
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="model-load", daemon=True).start()
    return await done


class Engine:
    """Base engine: subclasses provide `_load` (blocking), `_backend`, `_encode`, `_detokenizer`."""

    model_name: str = "model"
    context_length: int = 4096
    vocab_size: int | None = None  # token ids a logit_bias may name; None: any

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.scheduler: Scheduler | None = None
        self._seqs: dict[str, Sequence] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.load_error: str | None = None

    # --- lifecycle ----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def start(self) -> None:
        """Returns at once; loading and warm-up run in the background (see /ready)."""
        self._task = asyncio.create_task(self._boot())

    async def _boot(self) -> None:
        try:
            backend = await _in_passing_thread(lambda: (self._load(), self._backend())[1])
            self.scheduler = Scheduler(backend, self.settings.max_batch, self.settings.max_queue)
            self.scheduler.start(asyncio.get_running_loop())
            await self._warm_up()
            # What is loaded now lives as long as the process (the model's modules, the
            # tokenizer): out of the cyclic collector's scans, whose full pass over it took
            # 164 ms (375,000 objects) and stopped every stream at random while it ran
            gc.collect()  # no garbage is frozen with it
            gc.freeze()
            self._ready.set()
            log.info("engine ready: %s", self.model_name)
        except Exception as exc:  # noqa: BLE001 - surfaced by /ready and the logs
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("engine failed to start")

    async def _warm_up(self) -> None:
        """One short generation through the whole path, so the first user pays no warm-up."""
        prompt_ids, payload = self._encode([Message("user", "Hello")])
        prompt_ids = prompt_ids[
            : max(1, self.context_length - 2)
        ]  # even under a tiny CONTEXT_LENGTH
        gen = self._enqueue(prompt_ids, payload, SamplingParams(max_tokens=2, temperature=0))
        async for _ in gen:
            pass

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Waits until ready; raises RuntimeError at once if loading failed."""
        assert self._task is not None, "start() first"
        await asyncio.wait_for(asyncio.shield(self._task), timeout)
        if not self.ready:
            raise RuntimeError(self.load_error or "engine did not become ready")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)
        self._ready.clear()

    # --- requests -----------------------------------------------------------------------
    @property
    def running(self) -> int:
        return self.scheduler.running if self.scheduler else 0

    @property
    def waiting(self) -> int:
        return self.scheduler.waiting if self.scheduler else 0

    def step_times(self) -> StepTimes:
        """The model thread's time by kind of step (zeros before it starts)."""
        return self.scheduler.times if self.scheduler else StepTimes()

    def submit(self, messages: list[Message], params: SamplingParams) -> Generation:
        """Queues a generation. Raises NotReady, QueueFull, ContextLengthExceeded or InvalidParams."""
        if not self.ready:
            raise NotReady(self.load_error or "model is loading")
        return self._submit(messages, params)

    async def asubmit(self, messages: list[Message], params: SamplingParams) -> Generation:
        """submit() with the prompt tokenised in a worker thread: a long prompt's chat
        template and tokeniser must not hold the event loop, where every stream is written."""
        if not self.ready:
            raise NotReady(self.load_error or "model is loading")
        prompt_ids, payload = await asyncio.to_thread(self._encode, messages)
        return self._enqueue(prompt_ids, payload, params)

    def _submit(self, messages: list[Message], params: SamplingParams) -> Generation:
        prompt_ids, payload = self._encode(messages)
        return self._enqueue(prompt_ids, payload, params)

    def _enqueue(self, prompt_ids: list[int], payload: Any, params: SamplingParams) -> Generation:
        assert self.scheduler is not None
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {self.context_length} tokens; "
                f"the messages use {len(prompt_ids)} tokens."
            )
        self._check_params(params)
        # clamp: prompt + max_tokens <= context
        params = dataclasses.replace(params, max_tokens=min(params.max_tokens, room))
        seq = Sequence(
            prompt_ids, params, self._detokenizer(payload), asyncio.Queue(), payload=payload
        )
        self.scheduler.submit(seq)
        self._seqs[seq.request_id] = seq
        return Generation(self, seq)

    def _check_params(self, params: SamplingParams) -> None:
        if self.vocab_size is None:
            return
        outside = [token for token, _ in params.logit_bias if not 0 <= token < self.vocab_size]
        if outside:
            raise InvalidParams(
                f"logit_bias names token ids outside the vocabulary "
                f"(0..{self.vocab_size - 1}): {outside}",
                "logit_bias",
            )

    def cancel(self, request_id: str) -> bool:
        """Frees a request's slot (waiting: now; running: at the next decode step)."""
        seq = self._seqs.pop(request_id, None)
        if seq is None or self.scheduler is None:
            return False
        if not seq.done:
            self.scheduler.cancel(seq)
        return True

    def _forget(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)

    def cache_stats(self) -> Any:
        """The prefix cache's counters (inference.prefix_cache.CacheStats), or None without one."""
        return None

    # --- subclass hooks -----------------------------------------------------------------
    def _load(self) -> None:
        raise NotImplementedError

    def _backend(self) -> Any:
        raise NotImplementedError

    def _encode(self, messages: list[Message]) -> tuple[list[int], Any]:
        raise NotImplementedError

    def _detokenizer(self, payload: Any) -> Any:
        raise NotImplementedError
