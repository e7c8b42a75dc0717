"""Timings a busy machine does not fool: the load-time races between kernels.

The server picks some kernels by timing them against each other when it loads (the 4-bit
kernel of the layers and of the LM head, the prefill's dtype, one query's attention). Timed
while another process held a core, a choice flipped: on a 2-core AMD EPYC (Zen 3), a server
started while another was busy chose bfloat16 for its prefill, which is 4x float32's time
there, and kept it for its whole life (a 4,000-token prompt in 50 s instead of 13; others
took torch's 4-bit kernel or its int8 LM head the same way). The model server shares its
machine with the site and whatever else its owner runs, and restarts whenever it is told to:
a busy CPU at load is not only a benchmark's.

So a timed call counts only when none of this process's threads waited for a CPU while it ran
(their run-queue delay, /proc/self/task/*/schedstat, is the time they were ready to run and
did not): another process's work then shows as waiting, not as the kernel's time. The race
goes on until each call has enough clean times or its time is up; on a machine never quiet
for long enough (or without schedstat), every time counts, as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

# a time counts when its threads waited at most this share of it for a CPU
CLEAN_SHARE = 0.05
# the most seconds one race goes on for its clean times before it takes every time it has
PATIENCE = 5.0
TASKS = Path("/proc/self/task")


def run_delay() -> int | None:
    """Nanoseconds this process's threads have waited for a CPU while ready to run, in all;
    None where the kernel does not report it."""
    total, seen = 0, False
    try:
        tasks = os.listdir(TASKS)
    except OSError:
        return None
    for tid in tasks:
        try:
            total += int((TASKS / tid / "schedstat").read_text().split()[1])
            seen = True
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total if seen else None


def fastest(
    calls: dict[str, Callable[[], object]],
    rounds: int,
    patience: float = PATIENCE,
    delay: Callable[[], int | None] = run_delay,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """The best time of each call, its calls interleaved: of `rounds` clean times each (no
    thread of this process kept waiting for a CPU), or of every time where `patience`
    seconds did not give that many."""
    clean: dict[str, list[float]] = {name: [] for name in calls}
    every: dict[str, list[float]] = {name: [] for name in calls}
    deadline = clock() + patience
    while True:
        for name, call in calls.items():
            waited = delay()
            start = clock()
            call()
            spent = clock() - start
            after = delay()
            every[name].append(spent)
            if waited is None or after is None or (after - waited) / 1e9 <= CLEAN_SHARE * spent:
                clean[name].append(spent)
        if all(len(times) >= rounds for times in clean.values()):
            return {name: min(times) for name, times in clean.items()}
        if clock() > deadline and all(len(times) >= rounds for times in every.values()):
            log.warning(
                "the CPU was busy with other work while %s were timed at load "
                "(%s clean times of %s): the choice may be off",
                " against ".join(map(str, calls)),
                min(len(times) for times in clean.values()),
                rounds,
            )
            return {name: min(times) for name, times in every.items()}
