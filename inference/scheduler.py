"""Continuous batching: one model thread, many sequences.

Each step of the model thread: drop cancelled sequences, admit waiting ones, run one prefill
step over the admitted prompts (at most PREFILL_CHUNK_TOKENS, shared by all of them, so a long
prompt takes several steps), then one batched decode step over every running sequence. A
prompt joins the decode batch once its last chunk is computed; running streams therefore keep
their pace while a long prompt loads, a short request starts streaming after one step, and a
finished or cancelled one leaves the batch before the next step. When no request runs or waits
and the model has been idle for BACKGROUND_AFTER, a step does the backend's own work instead
(caching finished replies), so that work never slows a running stream. Results reach the
asyncio side through ``loop.call_soon_threadsafe`` (once per step, for all sequences), so the
event loop never waits on the model.

We use our own scheduler rather than transformers' ContinuousBatchingManager mainly because
the API needs a per-request seeded generator, and that manager's seed is manager-wide
(ContinuousBatchingConfig.seed); we also want stop strings, ignore_eos and cancellation in
one place, and no paged KV cache sized from RAM on CPU. `python -m bench.inference
--hf-manager` runs the manager beside us on the same model (figures: bench/README.md); it
prefills simultaneous arrivals in one step, where we admit whatever is waiting at each step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from inference.sampling_params import Sampled, SamplingParams, TokenLogprob
from inference.textstream import Detokenizer, StopFilter

log = logging.getLogger("inference.scheduler")
# The backend's own work (caching a finished reply) waits until no request has run for this
# long. Run beside decode steps, each of its chunks stalled every running stream (and cost 8
# streams up to a fifth of their throughput); and a conversation's next turn often follows its
# reply at once (a script, a quick user), and then computes the reply's tokens within its own
# prompt, in the same step, instead of waiting behind a background step doing the same work.
BACKGROUND_AFTER = 0.25
FinishReason = Literal["stop", "length", "cancelled"]
StepKind = Literal["prefill", "decode", "background"]
STEP_KINDS: tuple[StepKind, ...] = ("prefill", "decode", "background")


@dataclass(frozen=True)
class TokenEvent:
    text: str
    tokens: int  # tokens this text came from (held-back tokens are counted here)
    ts: float  # time.monotonic() when the newest of those tokens was produced
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, when the request asked


@dataclass(frozen=True)
class FinishEvent:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    ts: float
    text: str = ""  # held-back text released at the end (rare; sent before the finish chunk)
    logprobs: tuple[TokenLogprob, ...] = ()  # of the held-back tokens


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    ts: float


@dataclass(frozen=True)
class ProgressEvent:
    """How far a prompt's prefill has got (SamplingParams.return_progress): of `total`
    prompt tokens, `processed` have their KV, `cached` of them from the prefix cache."""

    total: int
    cached: int
    processed: int
    ts: float


Event = TokenEvent | FinishEvent | ErrorEvent | ProgressEvent


@dataclass
class StepTimes:
    """The model thread's time in each kind of step since the start, and how many steps
    (/metrics): where a long paste's time went, its prefill against the running streams'
    decode steps between its stages. Written by the model thread only."""

    seconds: dict[StepKind, float] = field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0.0))
    steps: dict[StepKind, int] = field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0))

    def add(self, kind: StepKind, started: float) -> None:
        """A step of `kind` that began at time.perf_counter() `started` has ended."""
        self.seconds[kind] += time.perf_counter() - started
        self.steps[kind] += 1


class QueueFull(Exception):
    """All running slots and all waiting slots are taken."""


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """One request inside the scheduler; mutated only by the model thread once submitted."""

    prompt_ids: list[int]
    params: SamplingParams
    detokenizer: Detokenizer
    queue: asyncio.Queue[Event]
    request_id: str = field(default_factory=lambda: f"seq-{next(_ids)}")
    payload: Any = None  # backend-specific (the fake engine's words)
    state: dict[str, Any] = field(default_factory=dict)  # backend-specific per-sequence state
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    done: bool = False
    _unsent: int = 0  # tokens produced but whose text is still held back
    _unsent_logprobs: list[TokenLogprob] = field(default_factory=list)
    _progress: tuple[int, int, int] | None = None  # the last ProgressEvent's figures

    def __post_init__(self) -> None:
        self.stops = StopFilter(list(self.params.stop))

    def accept(self, sampled: Sampled, is_eos: bool, now: float) -> list[Event]:
        """Adds one produced token; returns the events to send and marks `done` at the end."""
        if is_eos and not self.params.ignore_eos:
            return self._finish("stop", now)
        self.generated.append(sampled.token)
        self._unsent += 1
        if sampled.logprob is not None:
            self._unsent_logprobs.append(self._token_logprob(sampled))
        events: list[Event] = []
        text = self.stops.feed(self.detokenizer.push(sampled.token))
        if text:
            events.append(TokenEvent(text, self._unsent, now, self._take_logprobs()))
            self._unsent = 0
        if self.stops.stopped:
            return events + self._finish("stop", now)
        if len(self.generated) >= self.params.max_tokens:
            return events + self._finish("length", now)
        return events

    def _finish(self, reason: FinishReason, now: float) -> list[Event]:
        self.done = True
        tail = "" if self.stops.stopped else self.stops.feed(self.detokenizer.flush())
        tail += self.stops.flush()
        n = len(self.generated)
        return [FinishEvent(reason, len(self.prompt_ids), n, now, tail, self._take_logprobs())]

    def _token_logprob(self, sampled: Sampled) -> TokenLogprob:
        as_bytes = self.detokenizer.token_bytes
        assert sampled.logprob is not None
        return TokenLogprob(
            as_bytes(sampled.token),
            sampled.logprob,
            tuple((as_bytes(t), lp) for t, lp in sampled.top),
        )

    def _take_logprobs(self) -> tuple[TokenLogprob, ...]:
        taken = tuple(self._unsent_logprobs)
        self._unsent_logprobs.clear()
        return taken


class Backend(Protocol):
    """The model side; every method runs on the model thread only."""

    def prefill(self, seqs: list[Sequence]) -> list[Sampled | None]:
        """Advances the prompts of `seqs` by one prefill step; each prompt it completes joins
        the batch (in `seqs` order) with its first generated token, the others get None."""

    def decode(self, seqs: list[Sequence]) -> list[Sampled]:
        """One step over the whole batch (`seqs` is the batch, in admission order)."""

    def release(self, seqs: list[Sequence]) -> None:
        """Removes `seqs` from the batch."""

    def background(self) -> bool:
        """One step of the backend's own work, when no prompt waits; whether more remains."""

    def has_background(self) -> bool: ...

    def reset(self) -> None:
        """Drops the whole batch and every prompt being prefilled (after an error)."""

    def is_eos(self, token_id: int) -> bool: ...

    # Optional: prompt_progress(seq) -> (prompt tokens, of them cached, of them with their KV)
    # or None, for requests that ask for their prompt's progress (Scheduler._report_progress).


class Scheduler:
    def __init__(self, backend: Backend, max_batch: int, max_queue: int) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in the decode batch, in the backend's row order
        self._prefilling: list[Sequence] = []  # admitted, prompt not fully computed yet
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy_at = 0.0  # time.monotonic() at the end of the last step with requests
        self.times = StepTimes()

    # --- asyncio side -------------------------------------------------------------------
    @property
    def running(self) -> int:
        """Sequences holding a slot: decoding, or admitted and prefilling."""
        return len(self._running) + len(self._prefilling)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="model", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, seq: Sequence) -> None:
        with self._cond:
            if self._stopping:
                raise QueueFull("shutting down")
            if self.running + len(self._waiting) >= self.max_batch + self.max_queue:
                raise QueueFull("server is at capacity")
            self._waiting.append(seq)
            self._cond.notify()

    def cancel(self, seq: Sequence) -> None:
        """Frees the sequence's slot: at once if waiting, at the next step if running."""
        with self._cond:
            seq.cancelled = True
            if seq in self._waiting:
                self._waiting.remove(seq)
                seq.done = True
            self._cond.notify()

    # --- model thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._step():
                pass
        finally:
            self._fail(
                self._running + self._prefilling + list(self._waiting), "server shutting down"
            )

    def _step(self) -> bool:
        with self._cond:
            while not (self._stopping or self._waiting or self.running):
                if not self.backend.has_background():
                    self._cond.wait()
                    continue
                idle = time.monotonic() - self._busy_at
                if idle >= BACKGROUND_AFTER:
                    break
                self._cond.wait(BACKGROUND_AFTER - idle)
            if self._stopping:
                return False
            busy = bool(self._waiting or self.running)  # else: background work is due
            self._drop_cancelled()
            room = self.max_batch - self.running
            # counted as running from now on, so back-pressure sees them while they prefill
            self._prefilling.extend(
                self._waiting.popleft() for _ in range(min(room, len(self._waiting)))
            )
        self._guarded(self._prefill, None)
        self._guarded(self._decode, None)
        if busy:
            self._busy_at = time.monotonic()
        return True

    def _drop_cancelled(self) -> None:
        gone = [s for s in self._running + self._prefilling if s.cancelled]
        if gone:
            self._running = [s for s in self._running if not s.cancelled]
            self._prefilling = [s for s in self._prefilling if not s.cancelled]
            self.backend.release(gone)
            now = time.monotonic()
            self._deliver(
                [
                    (s, FinishEvent("cancelled", len(s.prompt_ids), len(s.generated), now))
                    for s in gone
                ]
            )
            for s in gone:
                s.done = True

    def _guarded(self, fn: Any, arg: Any) -> None:
        """A model error fails the sequences of the batch, never the thread."""
        try:
            fn(arg)
        except Exception as exc:  # noqa: BLE001 - reported to every affected client
            log.exception("model step failed")
            victims = list(dict.fromkeys(self._running + self._prefilling + (arg or [])))
            self._running, self._prefilling = [], []
            self.backend.reset()
            self._fail(victims, f"model error: {exc}")

    def _prefill(self, _: None) -> None:
        started = time.perf_counter()
        if not self._prefilling:
            if not self._running:
                self.backend.background()
                self.times.add("background", started)
            return
        tokens = self.backend.prefill(list(self._prefilling))
        self.times.add("prefill", started)
        self._report_progress(
            [s for s, t in zip(self._prefilling, tokens, strict=True) if t is None]
        )
        done = [(s, t) for s, t in zip(self._prefilling, tokens, strict=True) if t is not None]
        if done:
            self._prefilling = [
                s for s, t in zip(self._prefilling, tokens, strict=True) if t is None
            ]
            self._running.extend(s for s, _ in done)
            self._advance([s for s, _ in done], [t for _, t in done])

    def _report_progress(self, waiting: list[Sequence]) -> None:
        """A ProgressEvent for each prompt still prefilling whose request asked for them,
        where its prefill moved since the last one (a step of other prompts, or a stage of a
        chunk that has not gone through every layer yet, moves nothing)."""
        where = getattr(self.backend, "prompt_progress", None)
        asked = [s for s in waiting if s.params.return_progress]
        if where is None or not asked:
            return
        now = time.monotonic()
        out: list[tuple[Sequence, Event]] = []
        for seq in asked:
            figures = where(seq)
            # nothing computed yet (a step of other prompts' work): nothing to report
            if figures is not None and figures != seq._progress and figures[2] > figures[1]:
                seq._progress = figures
                out.append((seq, ProgressEvent(*figures, now)))
        self._deliver(out)

    def _decode(self, _: None) -> None:
        if self._running:
            started = time.perf_counter()
            tokens = self.backend.decode(list(self._running))
            self.times.add("decode", started)
            self._advance(list(self._running), tokens)

    def _advance(self, seqs: list[Sequence], tokens: list[Sampled]) -> None:
        now = time.monotonic()
        out: list[tuple[Sequence, Event]] = []
        for seq, tok in zip(seqs, tokens, strict=True):
            out.extend((seq, ev) for ev in seq.accept(tok, self.backend.is_eos(tok.token), now))
        finished = [s for s in seqs if s.done]
        if finished:
            self.backend.release(finished)
            self._running = [s for s in self._running if not s.done]
        self._deliver(out)

    def _fail(self, seqs: list[Sequence], message: str) -> None:
        now = time.monotonic()
        for s in seqs:
            s.done = True
        self._deliver([(s, ErrorEvent(message, now)) for s in seqs])

    def _deliver(self, items: list[tuple[Sequence, Event]]) -> None:
        if items and self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # loop closed between the check and the call
                pass


def _put_all(items: list[tuple[Sequence, Event]]) -> None:
    for seq, ev in items:
        seq.queue.put_nowait(ev)
