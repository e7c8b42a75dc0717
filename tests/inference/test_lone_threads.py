from inference.lone_threads import FIRST_TRIES, RETRY_AT_MOST, RETRY_EVERY, LoneThreads


def _run(choice: LoneThreads, steps: int, seconds: dict[int, float]) -> list[int]:
    """`steps` lone steps, each taking `seconds[count]` on the count picked."""
    picked = []
    for _ in range(steps):
        count = choice.pick()
        choice.record(count, seconds[count])
        picked.append(count)
    return picked


def test_a_fixed_count_is_used_whatever_the_steps_take() -> None:
    assert set(_run(LoneThreads(1, 2), 50, {1: 9.0, 2: 0.1})) == {1}
    assert set(_run(LoneThreads(0, 2), 50, {1: 0.1, 2: 9.0})) == {2}  # 0: all threads


def test_auto_times_each_count_and_then_keeps_the_faster() -> None:
    choice = LoneThreads(None, 2)
    picked = _run(choice, 2 * FIRST_TRIES + RETRY_EVERY - 1, {1: 0.030, 2: 0.020})
    assert picked[: 2 * FIRST_TRIES].count(1) == FIRST_TRIES
    assert set(picked[2 * FIRST_TRIES :]) == {2}
    # on a busy machine the same choice lands on one thread
    busy = _run(LoneThreads(None, 2), 2 * FIRST_TRIES + RETRY_EVERY, {1: 0.030, 2: 0.300})
    assert set(busy[2 * FIRST_TRIES :]) == {1}


def test_the_slower_count_is_retried_less_often_each_time_it_loses() -> None:
    choice = LoneThreads(None, 2)
    picked = _run(choice, 5000, {1: 0.030, 2: 0.300})
    retries = [i for i, count in enumerate(picked) if count == 2][FIRST_TRIES:]
    gaps = [b - a for a, b in zip(retries, retries[1:])]
    assert gaps[0] == RETRY_EVERY * 2 + 1
    assert all(later >= earlier for earlier, later in zip(gaps, gaps[1:]))
    assert max(gaps) == RETRY_AT_MOST + 1
    assert len(retries) < 15  # ~a tenth of a second lost in 5,000 steps, not one in 16


def test_auto_switches_when_the_machine_quietens() -> None:
    choice = LoneThreads(None, 2)
    _run(choice, 300, {1: 0.030, 2: 0.300})  # busy: one thread, retries far apart
    assert choice.pick() == 1
    quiet = _run(choice, RETRY_AT_MOST + 40, {1: 0.030, 2: 0.020})
    after = quiet[quiet.index(2) :]
    assert after[-1] == 2 and after.count(1) <= len(after) // RETRY_EVERY


def test_one_thread_in_all_has_nothing_to_choose() -> None:
    assert set(_run(LoneThreads(None, 1), 20, {1: 0.01})) == {1}
