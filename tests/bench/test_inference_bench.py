"""bench.inference's side-by-side report against an earlier commit's server."""

from __future__ import annotations

from typing import Any

from bench import inference
from bench.measure import Result


def _rate(tokens: int) -> Result:
    return Result(tokens=tokens, wall=1.0)


def test_the_earlier_commits_modes_are_labelled_with_it() -> None:
    args = inference.parse_args(["--before", "abc123", "--sampling", "temperature=0.5"])
    assert args.before == "abc123"
    assert inference._sampled("A", inference._at("abc123")) == "sampling A at abc123"
    assert inference._sampled("A", "batched HTTP") == "sampling A"


def test_each_mode_is_reported_against_the_same_mode_at_the_earlier_commit(capsys: Any) -> None:
    every = {
        ("batched HTTP", 8): [_rate(400), _rate(600), _rate(500)],
        ("batched HTTP at abc123", 8): [_rate(500), _rate(500), _rate(500)],
        ("sampling A", 8): [_rate(450), _rate(300)],
        ("sampling A at abc123", 8): [_rate(300), _rate(300)],
        ("sampling A", 1): [_rate(90)],  # its earlier twin not measured at N=1
    }
    inference.print_before(every, [1, 8], "abc123", samplings=1)
    out = capsys.readouterr().out
    assert "batched HTTP, N=8: 1.000x (0.80, 1.20, 1.00)" in out  # round by round, not medians
    assert "sampling A, N=8: 1.250x (1.50, 1.00)" in out
    assert "N=1" not in out


def test_a_round_with_failed_streams_is_left_out_of_the_ratios(capsys: Any) -> None:
    failed = Result(tokens=100, wall=1.0, failures=1)
    every = {
        ("batched HTTP", 8): [_rate(400), failed],
        ("batched HTTP at abc123", 8): [_rate(500), _rate(500)],
    }
    inference.print_before(every, [8], "abc123", samplings=0)
    assert "batched HTTP, N=8: 0.800x (0.80)" in capsys.readouterr().out
