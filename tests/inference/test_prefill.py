"""Prefill in chunks: fair shares of a step, edges, and a budget learnt from the steps run."""

from __future__ import annotations

import pytest

from inference.prefill import (
    ALIGN,
    MAX_GROWTH,
    MIN_BUDGET,
    StepPace,
    affordable,
    chunk_cost,
    plan_chunk,
    tile_cost,
)
from tests.support.prefill import prefill_job as job


def test_chunk_budget_is_shared_shortest_first() -> None:
    short, long_ = job(20), job(5000)
    plan = {id(j): n for j, n in plan_chunk([long_, short], 256, 3000.0)}
    assert plan[id(short)] == 20  # a short prompt finishes in its first step
    assert plan[id(long_)] == 2 * ALIGN  # its share (~230) taken to the next tile edge


def test_deep_tokens_count_for_more() -> None:
    assert affordable(256, 0, 3000.0) > affordable(256, 4000, 3000.0) > 256 // 3
    late = job(5000, done=4000)
    ((_, n),) = plan_chunk([late], 256, 3000.0)
    assert n == ALIGN - 4000 % ALIGN  # ~110 affordable there: up to the next edge


def test_a_chunk_ends_on_a_tile_edge_when_it_can() -> None:
    ((_, n),) = plan_chunk([job(5000, done=100)], 300, 3000.0)
    assert (100 + n) % ALIGN == 0 and 0 < n <= 300
    ((_, n),) = plan_chunk([job(5000, done=0)], 20, 3000.0)  # no edge within reach: as planned
    assert n == affordable(20, 0, 3000.0)
    ((_, n),) = plan_chunk([job(150, done=100)], 300, 3000.0)  # the prompt's end needs no edge
    assert n == 50


def test_a_deep_prompt_goes_tile_by_tile_without_slivers() -> None:
    """~120 tokens affordable per step there: each chunk a whole tile, none of a few tokens."""
    late = job(4000, done=3072)
    sizes = []
    while late.remaining:
        ((_, n),) = plan_chunk([late], 256, 3000.0)
        sizes.append(n)
        late.done += n
    assert sizes == [ALIGN] * 7 + [4000 - 3072 - 7 * ALIGN]


def test_no_budget_means_whole_prompts() -> None:
    jobs = [job(20), job(5000, done=10)]
    assert [n for _, n in plan_chunk(jobs, 0, 3000.0)] == [20, 4990]


def test_every_prompt_progresses() -> None:
    jobs = [job(3000) for _ in range(8)]
    assert all(n >= 1 for _, n in plan_chunk(jobs, 8, 3000.0)[:1])
    assert plan_chunk(jobs, 1, 3000.0)[0][1] == 1


def test_the_pace_starts_at_the_token_budget_and_learns_what_fits_the_step_time() -> None:
    pace = StepPace(tokens=256, seconds=0.2)
    assert pace.budget() == 256
    pace.record(cost=256, seconds=0.1, budget=256)  # half the time it may take
    assert pace.budget() == pytest.approx(512)
    for _ in range(10):  # steps at 1 ms a unit: the budget converges on 200 units
        pace.record(cost=pace.budget(), seconds=pace.budget() * 0.001, budget=pace.budget())
    assert pace.budget() == pytest.approx(200, rel=0.01)


def test_the_pace_keeps_its_budget_within_bounds() -> None:
    fast, slow = StepPace(tokens=256, seconds=0.2), StepPace(tokens=256, seconds=0.2)
    for _ in range(20):
        fast.record(cost=fast.budget(), seconds=1e-6, budget=fast.budget())
        slow.record(cost=slow.budget(), seconds=10.0, budget=slow.budget())
    assert fast.budget() == 256 * MAX_GROWTH
    assert slow.budget() == MIN_BUDGET


def test_one_slow_step_moves_the_pace_at_most_twofold_and_small_steps_teach_nothing() -> None:
    pace = StepPace(tokens=256, seconds=0.256)
    pace.record(cost=256, seconds=0.256, budget=256)  # 1 ms a unit: 256 fit
    pace.record(cost=256, seconds=25.6, budget=256)  # descheduled: 100x as long
    assert pace.budget() == pytest.approx(256 / 1.5)
    before = pace.budget()
    pace.record(cost=10, seconds=1.0, budget=before)  # a short prompt: the pass over weights
    assert pace.budget() == before


def test_a_step_of_whole_short_prompts_teaches_the_pace_nothing() -> None:
    pace = StepPace(tokens=256, seconds=0.256)
    pace.record(cost=256, seconds=0.256, budget=256)  # a long prompt's chunk: 1 ms a unit
    before = pace.budget()
    # a short question's step: counted as a whole tile, quick because its rows are few
    pace.record(cost=ALIGN, seconds=0.05, budget=before, whole_prompts=True)
    assert pace.budget() == before
    pace.record(cost=ALIGN, seconds=0.064, budget=before)  # a chunk again: learnt
    assert pace.budget() > before


def test_without_a_step_time_or_chunks_the_budget_is_the_token_count() -> None:
    fixed, whole = StepPace(tokens=256, seconds=0), StepPace(tokens=0, seconds=0.2)
    for pace in (fixed, whole):
        pace.record(cost=100, seconds=10.0, budget=100)
    assert (fixed.budget(), whole.budget()) == (256, 0)


def test_chunk_cost_counts_deep_tokens_for_more_and_rows_in_whole_tiles() -> None:
    assert chunk_cost([(job(5000), 100)], 3000.0) == pytest.approx(ALIGN + 100 * 50 / 3000)
    deep = chunk_cost([(job(5000, done=3000), 100)], 3000.0)
    assert deep == pytest.approx(ALIGN + 100 * 3050 / 3000)
    two = chunk_cost([(job(5000), 100), (job(300), 100)], 3000.0)
    assert two == pytest.approx(2 * ALIGN + 2 * 100 * 50 / 3000)


def test_a_learnt_budget_is_never_below_one_tile_of_the_deepest_prompt() -> None:
    jobs = [job(5000, done=3000), job(600)]
    floor = tile_cost(jobs, 3000.0)
    assert floor == pytest.approx(chunk_cost([(jobs[0], ALIGN)], 3000.0))
    pace = StepPace(tokens=256, seconds=0.2)
    pace.record(cost=256, seconds=10.0, budget=256)  # a slow machine: nothing fits 0.2 s
    assert pace.budget() < floor and pace.budget(floor) == floor
    assert StepPace(tokens=256, seconds=0).budget(floor) == 256  # fixed budgets stay as set
