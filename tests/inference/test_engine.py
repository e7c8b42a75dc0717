"""The Engine contract, written once and run against both engines (parametrized fixture)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inference.engine import ContextLengthExceeded, Engine, Message
from inference.fake_engine import FakeEngine
from inference.sampling_params import SamplingParams
from inference.scheduler import ErrorEvent, FinishEvent, QueueFull, TokenEvent
from tests.support.inference_app import fake_settings, model_settings

pytestmark = pytest.mark.anyio
PROMPT = "one two three four five six seven eight nine ten eleven twelve"
# Long enough that neither engine ends it by itself before the test is done with it.
LONG = "Count from one to one thousand, in words: " + PROMPT * 20


def _build(kind: str, request: pytest.FixtureRequest, **overrides: Any) -> Engine:
    if kind == "fake":
        return FakeEngine(fake_settings(fake_tokens_per_second=50, **overrides))
    from inference.hf_engine import TransformersEngine

    if kind == "transformers-cuda":
        loaded = request.getfixturevalue("loaded_model_cuda")
        return TransformersEngine(model_settings(device="cuda", **overrides), loaded=loaded)
    loaded = request.getfixturevalue("loaded_model")
    return TransformersEngine(model_settings(**overrides), loaded=loaded)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(
    params=[
        "fake",
        pytest.param("transformers", marks=pytest.mark.model),
        # DEVICE=cuda runs the same code; this machine has no GPU, a machine with one runs these
        pytest.param(
            "transformers-cuda",
            marks=[
                pytest.mark.model,
                pytest.mark.skipif(not _has_cuda(), reason="no CUDA device on this machine"),
            ],
        ),
    ]
)
def make_engine(request: pytest.FixtureRequest) -> Any:
    """Factory: `async with make_engine(max_batch=1) as engine:` a started, ready engine."""

    class _Started:
        def __init__(self, **overrides: Any) -> None:
            self.engine = _build(request.param, request, **overrides)

        async def __aenter__(self) -> Engine:
            await self.engine.start()
            await self.engine.wait_ready(120)
            return self.engine

        async def __aexit__(self, *exc: object) -> None:
            await self.engine.stop()

    return _Started


def _params(**kw: Any) -> SamplingParams:
    return SamplingParams(**({"max_tokens": 5, "temperature": 0} | kw))


async def _drain(gen: AsyncIterator[Any]) -> list[Any]:
    return [ev async for ev in gen]


async def test_stream_ends_with_one_finish(make_engine: Any) -> None:
    async with make_engine() as engine:
        events = await _drain(engine.submit([Message("user", PROMPT)], _params(max_tokens=4)))
    *tokens, end = events
    assert tokens and all(isinstance(e, TokenEvent) for e in tokens)
    assert isinstance(end, FinishEvent) and end.reason == "length"
    assert end.completion_tokens == 4 and end.prompt_tokens > 0
    assert sum(e.tokens for e in tokens) <= 4
    assert [e.ts for e in tokens] == sorted(e.ts for e in tokens)


async def test_ready_after_start_and_counts_drop_to_zero(make_engine: Any) -> None:
    async with make_engine() as engine:
        assert engine.ready and engine.running == 0 and engine.waiting == 0
        await _drain(engine.submit([Message("user", PROMPT)], _params(max_tokens=2)))
        assert engine.running == 0


async def test_what_is_loaded_is_left_out_of_the_cyclic_collectors_scans(
    make_engine: Any,
) -> None:
    import gc

    gc.unfreeze()
    try:
        async with make_engine() as engine:
            assert engine.ready and gc.get_freeze_count() > 0
            assert not any(o is engine for o in gc.get_objects())  # frozen: not scanned
    finally:
        gc.unfreeze()


async def test_context_length_exceeded(make_engine: Any) -> None:
    async with make_engine(context_length=40) as engine:
        with pytest.raises(ContextLengthExceeded):
            engine.submit([Message("user", PROMPT * 5)], _params())


async def test_max_tokens_clamped_to_context(make_engine: Any) -> None:
    async with make_engine() as engine:
        gen = engine.submit([Message("user", PROMPT)], _params(max_tokens=10**9))
        assert gen.prompt_tokens + gen.max_tokens == engine.context_length
        await gen.aclose()


async def test_cancel_frees_the_slot(make_engine: Any) -> None:
    async with make_engine(max_batch=1, max_queue=0) as engine:
        first = engine.submit([Message("user", LONG)], _params(max_tokens=500, ignore_eos=True))
        it = aiter(first)
        assert isinstance(await anext(it), TokenEvent)
        with pytest.raises(QueueFull):
            engine.submit([Message("user", PROMPT)], _params())
        assert engine.cancel(first.request_id)
        deadline = time.monotonic() + 5
        while engine.running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.running == 0
        second = await _drain(engine.submit([Message("user", PROMPT)], _params(max_tokens=2)))
        assert isinstance(second[-1], FinishEvent)


async def test_closing_the_iterator_cancels(make_engine: Any) -> None:
    async with make_engine(max_batch=1) as engine:
        gen = engine.submit([Message("user", LONG)], _params(max_tokens=500, ignore_eos=True))
        async for _ in gen:
            break  # leaving the loop closes the generator
        await gen.aclose()
        deadline = time.monotonic() + 5
        while engine.running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.running == 0


async def test_queue_full_when_all_slots_taken(make_engine: Any) -> None:
    async with make_engine(max_batch=1, max_queue=1) as engine:
        gens = [
            engine.submit([Message("user", LONG)], _params(max_tokens=500, ignore_eos=True))
            for _ in range(2)
        ]
        with pytest.raises(QueueFull):
            engine.submit([Message("user", PROMPT)], _params())
        for g in gens:
            await g.aclose()


async def test_new_request_streams_before_running_one_ends(make_engine: Any) -> None:
    async with make_engine(max_batch=4) as engine:
        long = engine.submit([Message("user", LONG)], _params(max_tokens=40, ignore_eos=True))
        it = aiter(long)
        await anext(it)  # the long one is running
        short = engine.submit([Message("user", PROMPT)], _params(max_tokens=2))
        first_short = await anext(aiter(short))
        assert isinstance(first_short, TokenEvent)
        assert not long.finished  # the long one is still going
        rest = [ev async for ev in it]
        assert isinstance(rest[-1], FinishEvent)
        assert first_short.ts < rest[-1].ts


async def test_stop_string_ends_with_stop(make_engine: Any) -> None:
    async with make_engine() as engine:
        full = await _drain(engine.submit([Message("user", PROMPT)], _params(max_tokens=6)))
        text = "".join(e.text for e in full if isinstance(e, TokenEvent | FinishEvent))
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        assert stop.strip()
        cut = await _drain(
            engine.submit([Message("user", PROMPT)], _params(max_tokens=6, stop=(stop,)))
        )
        cut_text = "".join(e.text for e in cut if isinstance(e, TokenEvent | FinishEvent))
        assert cut[-1].reason == "stop"
        assert cut_text == text[: text.index(stop)]


async def test_stop_fails_open_streams(make_engine: Any) -> None:
    ctx = make_engine()
    engine = await ctx.__aenter__()
    gen = engine.submit([Message("user", LONG)], _params(max_tokens=500, ignore_eos=True))
    it = aiter(gen)
    await anext(it)
    await engine.stop()
    rest = [ev async for ev in it]
    assert isinstance(rest[-1], ErrorEvent | FinishEvent)


class _Recording(FakeEngine):
    """Notes the thread that loaded it; fails to load when told to."""

    fail = False

    def _load(self) -> None:
        import threading

        self.loaded_in = threading.current_thread()
        if self.fail:
            raise OSError("no model here")
        super()._load()


async def test_the_model_loads_in_a_thread_of_its_own_that_ends() -> None:
    """No idle torch thread team may outlive the load beside the model thread's (it slowed
    every op of the model thread on 2 cores): not the event loop's, nor a pool's worker."""
    engine = _Recording(fake_settings())
    await engine.start()
    await engine.wait_ready(30)
    try:
        assert engine.loaded_in.name == "model-load"
        engine.loaded_in.join(10)
        assert not engine.loaded_in.is_alive()
    finally:
        await engine.stop()


async def test_a_failed_load_is_reported_not_raised() -> None:
    engine = _Recording(fake_settings())
    engine.fail = True
    await engine.start()
    with pytest.raises(RuntimeError, match="OSError: no model here"):
        await engine.wait_ready(30)
    assert not engine.ready
