"""The probe that lets a prefill's small pieces skip their tiles' zero padding: a narrower
call is kept only where it gave every row exactly the bits of the whole tile, and was faster."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from inference import narrow


@pytest.fixture(autouse=True)
def empty_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(narrow, "_linear", {})
    monkeypatch.setattr(narrow, "_attention", {})
    monkeypatch.setattr(narrow, "_pending", {})


def tile_call(tile: int, drift: dict[int, float], per_row_s: float = 2e-5):
    """A fake kernel over `tile` rows: a call of w rows is off by drift.get(w, 0) (another
    summation order) and takes per_row_s a row."""
    base = torch.randn(tile, 8, generator=torch.Generator().manual_seed(1))
    calls: list[tuple[int, int]] = []

    def call(r0: int, r1: int) -> tuple[torch.Tensor, ...]:
        calls.append((r0, r1))
        time.sleep(per_row_s * (r1 - r0))
        return (base[r0:r1] + drift.get(r1 - r0, 0.0),)

    return call, calls


def test_a_width_is_kept_only_where_every_row_keeps_its_bits() -> None:
    call, calls = tile_call(64, {32: 1e-3}, per_row_s=1e-4)
    widths = narrow.attention_widths((64, "shape"), lambda: call)
    assert widths == (4, 8, 12, 16, 24, 40, 48, 56)
    # every start at a multiple of ATTENTION_STEP was tried for each width kept, and of
    # FINE_STEP for the fine ones
    assert (narrow.ATTENTION_STEP, narrow.FINE_STEP, narrow.FINE_WIDTH) == (8, 4, 16)
    assert {(0, 48), (8, 56), (16, 64), (0, 56), (8, 64)} <= set(calls)
    fine = {(r0, r0 + w) for w in (4, 8, 12, 16) for r0 in range(0, 64 - w + 1, 4)}
    assert fine <= set(calls)
    assert (4, 52) not in calls  # a coarse width only on its own grid


def test_a_width_off_at_one_start_only_is_not_kept() -> None:
    base = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))

    def call(r0: int, r1: int) -> tuple[torch.Tensor, ...]:
        time.sleep(1e-4 * (r1 - r0))
        off = 1e-3 if (r0, r1) == (40, 56) else 0.0  # a remainder path at one offset
        return (base[r0:r1] + off,)

    assert 16 not in narrow.attention_widths((64, "one start"), lambda: call)


def test_a_width_slower_than_the_whole_tile_is_not_kept() -> None:
    base = torch.zeros(64, 8)

    def call(r0: int, r1: int) -> tuple[torch.Tensor, ...]:
        time.sleep(0.004 if r1 - r0 < 64 else 0.001)  # narrow rows took a slower path
        return (base[r0:r1],)

    assert narrow.attention_widths((64, "slow"), lambda: call) == ()


def test_each_shape_is_probed_once() -> None:
    made: list[int] = []

    def prober():
        made.append(1)
        return tile_call(64, {})[0]

    for _ in range(3):
        narrow.attention_widths((64, "once"), prober)
    assert made == [1]


def test_a_probe_in_slices_keeps_what_a_probe_at_once_keeps() -> None:
    """The server probes in its idle time a slice at a time (one call each with no time to
    spare): the same widths, from one prober, and the calls spread over many slices."""
    made: list[int] = []
    call, calls = tile_call(64, {32: 1e-3}, per_row_s=1e-4)

    def prober():
        made.append(1)
        return call

    slices, ran = 0, []
    done = False
    while not done:
        before = len(calls)
        done = narrow.attention_probe_for((64, "sliced"), prober, 0.0)
        slices += 1
        ran.append(len(calls) - before)
    # a timed call (best of two) or one check each; the last may only return what it found
    assert set(ran[:-1]) == {1, 2} and ran[-1] <= 2
    assert narrow.attention_widths((64, "sliced"), prober) == (4, 8, 12, 16, 24, 40, 48, 56)
    assert made == [1] and slices > 10 and not narrow._pending


def test_a_probe_begun_in_idle_time_is_finished_where_a_prompt_needs_it() -> None:
    made: list[int] = []
    call, calls = tile_call(64, {32: 1e-3}, per_row_s=1e-4)

    def prober():
        made.append(1)
        return call

    assert not narrow.attention_probe_for((64, "begun"), prober, 0.0)
    begun = len(calls)
    assert narrow.attention_widths((64, "begun"), prober) == (4, 8, 12, 16, 24, 40, 48, 56)
    assert made == [1] and calls[:begun] == [(0, 64), (0, 64)]  # not started over
    assert calls.count((0, 64)) == 2 and not narrow._pending
    assert narrow.attention_probe_for((64, "begun"), prober, 0.0)  # done: nothing to run
    assert made == [1]


def test_turned_off_nothing_is_narrowed_or_probed() -> None:
    narrow.enabled = False
    try:
        assert narrow.attention_widths((64, "off"), lambda: pytest.fail("probed")) == ()
        assert narrow.linear_rows(5, torch.randn(16, 32), None, 128) == 128
    finally:
        narrow.enabled = True


def _drift_linear_calls(monkeypatch: pytest.MonkeyPatch, drifts: Callable[[int], bool]) -> None:
    """A linear kernel whose calls of `drifts(rows)` rows sum in another order (their bits
    move a little), as oneDNN's AMX kernels do for some row counts."""
    linear = narrow.onednn.linear
    monkeypatch.setattr(
        narrow.onednn,
        "linear",
        lambda x, w, b, packed: linear(x, w, b, packed) + drifts(x.shape[0]) * 1e-3,
    )


def test_a_linear_kernel_whose_sums_follow_the_row_count_keeps_whole_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _drift_linear_calls(monkeypatch, lambda rows: rows != 128)
    assert narrow.linear_rows(20, torch.randn(256, 576), None, 128) == 128


def test_the_last_rows_of_a_linear_get_the_narrowest_width_that_holds_them() -> None:
    weight = torch.randn(1536, 576, dtype=torch.bfloat16)
    narrow.linear_rows(1, weight, None, 128)
    [widths] = narrow._linear.values()  # whatever this CPU allows, each checked bit for bit
    assert all((w in narrow.SMALL_WIDTHS or w % narrow.STEP == 0) and w < 128 for w in widths)
    for rows in (1, 3, 16, 17, 100):
        expect = next((w for w in widths if w >= rows), 128)
        assert narrow.linear_rows(rows, weight, None, 128) == expect


def test_a_tile_of_sixteen_rows_or_fewer_is_probed_at_the_small_widths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The LM head's prefill call (16 rows): a lone prompt's row need not pay for 15 more."""
    _drift_linear_calls(monkeypatch, lambda rows: rows == 2)
    weight = torch.randn(4096, 576, dtype=torch.bfloat16)
    narrow.linear_rows(1, weight, None, 16)
    [widths] = narrow._linear.values()
    assert set(widths) <= {1, 4, 8, 12}  # 2 rows drifted: never used
    for rows in (1, 2, 3, 9):
        expect = next((w for w in widths if w >= rows), 16)
        assert narrow.linear_rows(rows, weight, None, 16) == expect


def test_a_whole_tile_is_probed_at_small_widths_too_where_their_rows_keep_their_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prompt's one new token (resent, or a short next turn) need not pay for 16 rows in
    every layer; a width whose calls sum otherwise (2 rows here) is never used."""
    _drift_linear_calls(monkeypatch, lambda rows: rows == 2)
    weight = torch.randn(1536, 576)
    narrow.linear_rows(1, weight, None, 128)
    [widths] = narrow._linear.values()
    assert 2 not in widths
    assert narrow.linear_rows(2, weight, None, 128) in (*widths, 128)
    assert narrow.linear_rows(2, weight, None, 128) != 2
