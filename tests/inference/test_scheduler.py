"""The scheduler's step loop with chunked prefill, on a scripted backend (no model)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from inference.sampling_params import Sampled
from inference.scheduler import (
    FinishEvent,
    ProgressEvent,
    SamplingParams,
    Scheduler,
    Sequence,
    TokenEvent,
)

pytestmark = pytest.mark.anyio


class Letters:
    def push(self, token_id: int) -> str:
        return "x"

    def flush(self) -> str:
        return ""


class ChunkedBackend:
    """A prompt takes `payload` prefill steps; every step is logged."""

    def __init__(self, background_steps: int = 0) -> None:
        self.log: list[tuple[str, tuple[str, ...]]] = []
        self.left: dict[int, int] = {}
        self.batch: list[Sequence] = []
        self.background_steps = background_steps

    def prefill(self, seqs: list[Sequence]) -> list[Sampled | None]:
        self.log.append(("prefill", tuple(s.request_id for s in seqs)))
        out: list[Sampled | None] = []
        for s in seqs:
            self.left[id(s)] = self.left.get(id(s), s.payload) - 1
            out.append(Sampled(1) if self.left[id(s)] == 0 else None)
            if out[-1] is not None:
                self.batch.append(s)
        return out

    def decode(self, seqs: list[Sequence]) -> list[Sampled]:
        assert seqs == self.batch
        self.log.append(("decode", tuple(s.request_id for s in seqs)))
        return [Sampled(1)] * len(seqs)

    def release(self, seqs: list[Sequence]) -> None:
        self.log.append(("release", tuple(s.request_id for s in seqs)))
        self.batch = [s for s in self.batch if s not in seqs]

    def background(self) -> bool:
        self.background_steps -= 1
        self.log.append(("background", ()))
        return self.background_steps > 0

    def has_background(self) -> bool:
        return self.background_steps > 0

    def reset(self) -> None:
        self.batch = []

    def is_eos(self, token_id: int) -> bool:
        return False


def seq(name: str, steps: int, tokens: int) -> Sequence:
    s = Sequence(
        [0] * 10, SamplingParams(max_tokens=tokens), Letters(), asyncio.Queue(), payload=steps
    )
    s.request_id = name
    return s


async def finish(s: Sequence) -> list[Any]:
    events = []
    while not events or not isinstance(events[-1], FinishEvent):
        events.append(await asyncio.wait_for(s.queue.get(), 10))
    return events


async def background_done(backend: ChunkedBackend) -> None:
    for _ in range(5000):
        if not backend.has_background():
            return
        await asyncio.sleep(0.001)


async def started(s: Sequence) -> None:
    while s.queue.empty():
        await asyncio.sleep(0.001)


async def test_running_streams_decode_between_the_chunks_of_a_long_prompt() -> None:
    backend = ChunkedBackend()
    sched = Scheduler(backend, max_batch=4, max_queue=4)
    sched.start(asyncio.get_running_loop())
    try:
        short = seq("short", 1, 1_000_000)
        sched.submit(short)
        await started(short)
        long_ = seq("long", 5, 2)
        sched.submit(long_)
        events = await finish(long_)
        sched.cancel(short)
    finally:
        sched.stop()
    assert isinstance(events[0], TokenEvent)
    steps = [entry for entry in backend.log if "long" in entry[1] or entry[0] == "decode"]
    first = steps.index(("prefill", ("long",)))
    # five prefill steps of the long prompt, each followed by a decode step of the running one
    assert steps[first : first + 10] == [("prefill", ("long",)), ("decode", ("short",))] * 4 + [
        ("prefill", ("long",)),
        ("decode", ("short", "long")),
    ]


async def test_arriving_prompts_share_the_prefill_step() -> None:
    backend = ChunkedBackend()
    sched = Scheduler(backend, max_batch=4, max_queue=4)
    a, b = seq("a", 3, 1), seq("b", 1, 1)
    sched.submit(a)
    sched.submit(b)
    sched.start(asyncio.get_running_loop())
    try:
        await finish(a)
        await finish(b)
    finally:
        sched.stop()
    assert backend.log[0] == ("prefill", ("a", "b"))
    assert backend.log[1] == ("release", ("b",))  # b done after one step (max_tokens 1)
    assert ("prefill", ("a",)) in backend.log


async def test_cancel_while_prefilling_frees_the_slot() -> None:
    backend = ChunkedBackend()
    sched = Scheduler(backend, max_batch=1, max_queue=0)
    sched.start(asyncio.get_running_loop())
    try:
        long_ = seq("long", 10_000, 5)
        sched.submit(long_)
        while ("prefill", ("long",)) not in backend.log:
            await asyncio.sleep(0.001)
        assert sched.running == 1
        sched.cancel(long_)
        assert (await finish(long_))[-1].reason == "cancelled"
        assert ("release", ("long",)) in backend.log
        nxt = seq("next", 1, 1)
        sched.submit(nxt)  # the slot is free again
        await finish(nxt)
    finally:
        sched.stop()


async def test_background_work_runs_while_idle() -> None:
    backend = ChunkedBackend(background_steps=3)
    sched = Scheduler(backend, max_batch=1, max_queue=0)
    sched.start(asyncio.get_running_loop())
    try:
        await background_done(backend)
    finally:
        sched.stop()
    assert backend.log == [("background", ())] * 3


async def test_background_work_waits_until_the_model_is_idle(monkeypatch) -> None:
    """A request that follows another at once is served before the backend's own work."""
    from inference import scheduler

    class Sealing(ChunkedBackend):
        def release(self, seqs: list[Sequence]) -> None:
            super().release(seqs)
            if seqs[0].request_id == "first":
                self.background_steps = 2  # the finished reply, to be cached

    monkeypatch.setattr(scheduler, "BACKGROUND_AFTER", 2.0)
    backend = Sealing()
    sched = Scheduler(backend, max_batch=1, max_queue=1)
    sched.start(asyncio.get_running_loop())
    try:
        first = seq("first", 1, 1)
        sched.submit(first)
        await finish(first)
        second = seq("second", 1, 1)
        sched.submit(second)
        await finish(second)
        assert ("background", ()) not in backend.log
        await background_done(backend)
    finally:
        sched.stop()
    assert backend.log[-2:] == [("background", ())] * 2


async def test_background_work_never_runs_beside_a_stream() -> None:
    backend = ChunkedBackend(background_steps=2)
    sched = Scheduler(backend, max_batch=1, max_queue=1)
    busy = seq("busy", 1, 30)
    sched.submit(busy)  # before the start: no idle moment for the background work
    sched.start(asyncio.get_running_loop())
    try:
        await finish(busy)
        await background_done(backend)
    finally:
        sched.stop()
    done = backend.log.index(("release", ("busy",)))
    assert ("background", ()) not in backend.log[:done]
    assert backend.log[done + 1 :] == [("background", ())] * 2


class SlowPrefill(ChunkedBackend):
    """Each prefill step takes 20 ms: its time must show in the prefill figure."""

    def prefill(self, seqs: list[Sequence]) -> list[Sampled | None]:
        time.sleep(0.02)
        return super().prefill(seqs)


async def test_step_times_count_each_kind_of_step_and_its_time() -> None:
    backend = SlowPrefill(background_steps=2)
    sched = Scheduler(backend, max_batch=4, max_queue=4)
    sched.start(asyncio.get_running_loop())
    try:
        await finish_submitted(sched, seq("long", 3, 4))
        await background_done(backend)
    finally:
        sched.stop()
    kinds = [entry[0] for entry in backend.log]
    times = sched.times
    assert times.steps == {
        "prefill": kinds.count("prefill"),
        "decode": kinds.count("decode"),
        "background": kinds.count("background"),
    }
    assert times.steps["prefill"] == 3 and times.steps["decode"] == 3
    assert times.steps["background"] == 2
    assert times.seconds["prefill"] >= 3 * 0.02
    assert times.seconds["decode"] < times.seconds["prefill"]


async def finish_submitted(sched: Scheduler, s: Sequence) -> list[Any]:
    sched.submit(s)
    return await finish(s)


class ReportingBackend(ChunkedBackend):
    """ChunkedBackend whose prompts report the scripted figures of `progress`, one per step:
    (prompt tokens, cached, with their KV)."""

    def __init__(self, progress: list[tuple[int, int, int]]) -> None:
        super().__init__()
        self.progress = progress

    def prompt_progress(self, s: Sequence) -> tuple[int, int, int]:
        return self.progress[s.payload - self.left[id(s)] - 1]


async def test_a_prompt_that_asked_is_told_each_move_of_its_prefill_and_only_moves() -> None:
    # step 1 computed nothing for it (another prompt's chunk), step 3 moved nothing
    backend = ReportingBackend([(100, 16, 16), (100, 16, 48), (100, 16, 48), (100, 16, 80)])
    sched = Scheduler(backend, max_batch=4, max_queue=4)
    asked = seq("asked", 5, 1)
    asked.params = SamplingParams(max_tokens=1, return_progress=True)
    quiet = seq("quiet", 5, 1)
    sched.submit(asked)
    sched.submit(quiet)
    sched.start(asyncio.get_running_loop())
    try:
        events, others = await finish(asked), await finish(quiet)
    finally:
        sched.stop()
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    assert [(e.total, e.cached, e.processed) for e in progress] == [(100, 16, 48), (100, 16, 80)]
    assert events.index(progress[-1]) < next(
        i for i, e in enumerate(events) if isinstance(e, TokenEvent)
    )
    assert not any(isinstance(e, ProgressEvent) for e in others)  # it did not ask
