"""bench.long_context reads where the model's time went from the server's own /metrics."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from bench import long_context
from bench.long_context import largest_gap, parse_model_steps, steps_between
from chat.inference_client.http import PROGRESS_FIELD
from inference.metrics import Metrics
from inference.scheduler import StepTimes


def metrics_text(times: StepTimes) -> str:
    return Metrics(lambda: 0, lambda: 0, step_times=lambda: times).render().decode()


def test_the_benchmark_reads_the_servers_step_times_from_its_metrics() -> None:
    times = StepTimes()
    times.seconds.update(prefill=2.5, decode=0.75)
    times.steps.update(prefill=3, decode=20)
    assert parse_model_steps(metrics_text(times)) == {
        "prefill": (2.5, 3),
        "decode": (0.75, 20),
        "background": (0.0, 0),
    }


def test_the_steps_between_two_scrapes_are_their_differences() -> None:
    before, after = StepTimes(), StepTimes()
    before.seconds.update(prefill=1.0, decode=0.5)
    before.steps.update(prefill=2, decode=10)
    after.seconds.update(prefill=4.0, decode=0.75)
    after.steps.update(prefill=5, decode=17)
    spent = steps_between(
        parse_model_steps(metrics_text(before)), parse_model_steps(metrics_text(after))
    )
    assert spent == {"prefill": (3.0, 3), "decode": (0.25, 7), "background": (0.0, 0)}


def test_a_server_without_step_times_has_none_to_report() -> None:
    assert parse_model_steps('inference_requests_total{outcome="ok"} 1.0\n') is None
    assert steps_between(None, {"prefill": (1.0, 1)}) is None


def test_the_largest_gap_is_placed_in_the_paste_and_against_the_question() -> None:
    streams = [{"times": [0.0, 0.1, 0.2, 1.5, 1.6]}, {"times": [0.05, 0.15, 1.2, 1.3]}]
    question = {"start": 1.0, "times": [1.4]}
    gap = largest_gap(streams, (0.5, 2.0), question)
    assert gap == {
        "max_gap": pytest.approx(1.3),
        "max_gap_at": pytest.approx(-0.3),
        "max_gap_question": True,
    }
    late = {"start": 1.55, "times": [1.9]}
    assert largest_gap(streams, (0.5, 2.0), late)["max_gap_question"] is False


def test_gaps_that_end_before_the_paste_are_not_its_gaps() -> None:
    streams = [{"times": [0.0, 0.4, 0.45]}]
    gap = largest_gap(streams, (0.5, 2.0), {"start": math.inf, "times": []})
    assert math.isnan(gap["max_gap"]) and gap["max_gap_question"] is False


def sse(*chunks: dict) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def read_stream(monkeypatch, fields: dict | None = None) -> tuple[dict, dict]:
    """(the request's body, what stream() read) from a scripted server: two progress
    reports, then two tokens and the usage. `fields`: SITE_FIELDS instead of its default."""
    if fields is not None:
        monkeypatch.setattr(long_context, "SITE_FIELDS", fields)
    sent = {}

    def answer(request: httpx.Request) -> httpx.Response:
        sent.update(json.loads(request.content))
        progress = {"total": 40, "cache": 0, "processed": 20, "time_ms": 5}
        body = sse(
            {"choices": [], "prompt_progress": progress},
            {"choices": [], "prompt_progress": {**progress, "processed": 40}},
            {"choices": [{"delta": {"content": "Hel"}}]},
            {"choices": [{"delta": {"content": "lo"}}]},
            {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 2}},
        )
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def run() -> dict:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return await long_context.stream(client, "http://model", [], 4)

    return sent, asyncio.run(run())


def test_the_benchmark_asks_for_the_prompts_progress_as_the_site_does(monkeypatch) -> None:
    sent, read = read_stream(monkeypatch)
    assert sent[PROGRESS_FIELD] is True  # the field the site's client sends by default
    assert (read["progress"], read["text"], read["prompt_tokens"]) == (2, "Hello", 40)
    assert len(read["times"]) == 2  # progress reports are not tokens


def test_no_progress_leaves_the_field_out(monkeypatch) -> None:
    sent, _ = read_stream(monkeypatch, {})
    assert PROGRESS_FIELD not in sent
