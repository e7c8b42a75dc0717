"""Load-time kernel races that another process's work on the CPU does not decide."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from inference import quiet_timing
from inference.quiet_timing import fastest, run_delay


class Machine:
    """A scripted clock and run-queue delay: each call takes its time, and while the machine
    is busy it takes `busy_factor` times as long, its threads waiting for a CPU meanwhile."""

    def __init__(self, times: dict[str, float], busy_rounds: dict[str, int], factor: float = 5):
        self.now, self.waited = 0.0, 0
        self.times, self.busy_rounds, self.factor = times, busy_rounds, factor
        self.calls = dict.fromkeys(times, 0)

    def call(self, name: str):
        def run() -> None:
            busy = self.calls[name] < self.busy_rounds.get(name, 0)
            self.calls[name] += 1
            spent = self.times[name] * (self.factor if busy else 1)
            self.now += spent
            if busy:  # the extra time was spent waiting for a CPU
                self.waited += int((spent - self.times[name]) * 1e9)

        return run

    def race(self, rounds: int, patience: float = 5.0, delay=None) -> dict[str, float]:
        return fastest(
            {name: self.call(name) for name in self.times},
            rounds,
            patience=patience,
            delay=delay or (lambda: self.waited),
            clock=lambda: self.now,
        )


def test_a_time_taken_while_the_cpu_was_busy_does_not_decide_the_race() -> None:
    # float32 is the faster, but every one of its first 7 calls shared the CPU with another
    # process: best of 7 of all times, bfloat16 would have won
    machine = Machine({"float32": 1.0, "bfloat16": 4.0}, busy_rounds={"float32": 7}, factor=5)
    best = machine.race(rounds=7, patience=1000)
    assert best == {"float32": 1.0, "bfloat16": 4.0}
    assert machine.calls["float32"] == 14  # it went on until float32 had 7 clean times


def test_on_a_machine_never_quiet_every_time_counts_once_its_patience_is_spent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    machine = Machine({"a": 1.0, "b": 2.0}, busy_rounds={"a": 10**6, "b": 10**6}, factor=3)
    with caplog.at_level(logging.WARNING, logger=quiet_timing.__name__):
        best = machine.race(rounds=3, patience=20)
    assert best == {"a": 3.0, "b": 6.0}
    assert machine.now <= 20 + 3 + 6  # the round under way when patience ran out, no more
    assert "busy" in caplog.text and "a against b" in caplog.text  # which race, to pin it


def test_where_the_kernel_reports_no_run_delay_every_time_counts() -> None:
    machine = Machine({"a": 1.0, "b": 2.0}, busy_rounds={"a": 2})
    assert machine.race(rounds=3, delay=lambda: None) == {"a": 1.0, "b": 2.0}
    assert machine.calls == {"a": 3, "b": 3}


def test_the_run_delay_counts_the_time_a_thread_waited_for_a_cpu_another_process_held() -> None:
    if run_delay() is None:
        pytest.skip("this kernel reports no run-queue delay (/proc/self/task/*/schedstat)")
    spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    burners = [
        subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        time.sleep(0.2)  # the burners are running
        before, start = run_delay(), time.perf_counter()
        while time.perf_counter() - start < 0.5:
            pass
        waited = (run_delay() - before) / 1e9
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    # three runnable threads per CPU: this one ran about a third of the time
    assert waited > 0.1
