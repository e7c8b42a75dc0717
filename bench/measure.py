"""What the inference server's benchmarks share: their prompts, what one mode measures at one
concurrency, how that prints as a table row, and how sampling fields are given on the
command line."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

PROMPTS = [
    "Tell me a story about a lighthouse keeper.",
    "Explain how rain forms.",
    "Write a poem about the sea.",
    "Describe a busy market in the morning.",
]
HEADER = f"{'mode':<28} {'N':>3} {'tok/s':>8} {'ttft50':>7} {'ttft99':>7} {'itl50ms':>8} {'itl99ms':>8} {'fail':>5}"


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
