"""bench.long_context reads where the model's time went from the server's own /metrics."""

from __future__ import annotations

import math

import pytest

from bench.long_context import largest_gap, parse_model_steps, steps_between
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
