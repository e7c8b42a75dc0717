"""What the inference server's benchmarks share: their prompts, what one mode measures at one
concurrency, how that prints as a table row, and how sampling fields are given on the
command line."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROMPTS = [
    "Tell me a story about a lighthouse keeper.",
    "Explain how rain forms.",
    "Write a poem about the sea.",
    "Describe a busy market in the morning.",
]
HEADER = f"{'mode':<28} {'N':>3} {'tok/s':>8} {'ttft50':>7} {'ttft99':>7} {'itl50ms':>8} {'itl99ms':>8} {'fail':>5}"


ROOT = Path(__file__).parents[1]


def unpack_commit(commit: str, into: Path) -> Path:
    """The tree of `commit` (git archive of this repository), unpacked into a new folder."""
    into.mkdir(parents=True)
    tree = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tree, check=True)
    return into


def commit_tree(stack: contextlib.ExitStack, commit: str) -> Path:
    """The tree of `commit`, unpacked in a temporary folder for the life of `stack`."""
    return unpack_commit(commit, Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tree")


def sampling_fields(text: str) -> dict[str, Any]:
    """'temperature=0.5,top_p=0.9' -> {"temperature": 0.5, "top_p": 0.9} (values read as JSON)."""
    fields = dict(part.split("=", 1) for part in text.split(",") if part)
    return {key.strip(): json.loads(value) for key, value in fields.items()}


def percentile(values: list[float], pct: int) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


@dataclass
class Result:
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    failures: int = 0
    wall: float = 0.0

    @property
    def rate(self) -> float:
        return self.tokens / self.wall if self.wall else float("nan")

    def row(self, label: str, n: int) -> str:
        return (
            f"{label:<28} {n:>3} {self.rate:>8.1f} {percentile(self.ttft, 50):>7.2f} "
            f"{percentile(self.ttft, 99):>7.2f} {percentile(self.itl, 50) * 1000:>8.0f} "
            f"{percentile(self.itl, 99) * 1000:>8.0f} {self.failures:>5}"
        )


def _busy_idle() -> tuple[int, int]:
    """The machine's busy and idle CPU time so far, in clock ticks (Linux /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, idle


def wait_for_quiet(busy_below: float = 0.15, window: float = 0.5, timeout: float = 60.0) -> float:
    """Waits until the machine's CPUs are at most `busy_below` busy over `window` seconds, so a
    server still doing its own work after the last measurement (our prefix cache filling in
    the background, llama.cpp finishing a prompt whose client left) does not land on the next
    one: on 2 cores it made a 4,000-token paste's TTFT swing from 4 s to 15 s. Returns the
    seconds waited (timeout: gives up, for a machine that is never quiet)."""
    start = time.monotonic()
    try:
        before = _busy_idle()
    except OSError:  # not Linux: nothing to wait on
        return 0.0
    while time.monotonic() - start < timeout:
        time.sleep(window)
        after = _busy_idle()
        busy, idle = after[0] - before[0], after[1] - before[1]
        if busy + idle and busy / (busy + idle) <= busy_below:
            break
        before = after
    return time.monotonic() - start
