"""bench.measure's wait for a quiet machine, on made-up CPU counters, and the earlier commit
it unpacks for side-by-side runs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from bench import measure


def _counters(monkeypatch: Any, samples: list[tuple[int, int]]) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []

    def read() -> tuple[int, int]:
        seen.append(samples[min(len(seen), len(samples) - 1)])
        return seen[-1]

    monkeypatch.setattr(measure, "_busy_idle", read)
    return seen


def test_it_waits_until_a_window_is_mostly_idle(monkeypatch: Any) -> None:
    # busy 90% over the first window, 10% over the second
    seen = _counters(monkeypatch, [(0, 0), (90, 10), (100, 100)])
    measure.wait_for_quiet(busy_below=0.15, window=0.001, timeout=5)
    assert len(seen) == 3


def test_a_machine_never_quiet_gives_up_at_the_timeout(monkeypatch: Any) -> None:
    busy = [(i * 100, 0) for i in range(10_000)]
    _counters(monkeypatch, busy)
    waited = measure.wait_for_quiet(window=0.001, timeout=0.05)
    assert 0.05 <= waited < 1


def test_an_earlier_commit_is_unpacked_as_it_was_committed(tmp_path: Path) -> None:
    tree = measure.unpack_commit("HEAD", tmp_path / "tree")
    committed = subprocess.run(
        ["git", "show", "HEAD:inference/sampling.py"],
        cwd=measure.ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert (tree / "inference" / "sampling.py").read_text() == committed
    assert not (tree / ".git").exists()
