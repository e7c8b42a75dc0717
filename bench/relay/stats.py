"""Figures of the relay benchmark: percentiles, a process's CPU time from /proc, and the
exactly-once check of what each client received."""

import os
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class ProcessStats:
    """CPU seconds, RSS and threads of some processes (the site's), from /proc."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.ticks = os.sysconf("SC_CLK_TCK")

    def cpu_seconds(self) -> float:
        total = 0
        for pid in self.pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / self.ticks

    def rss_mb_and_threads(self) -> tuple[float, int]:
        rss = threads = 0
        for pid in self.pids:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            status = dict(line.split(":", 1) for line in lines)
            rss += int(status["VmRSS"].split()[0]) / 1024
            threads += int(status["Threads"])
        return rss, threads


def new_result() -> dict:
    return {"seqs": [], "text": [], "latency": [], "first_token": [], "arrivals": [], "errors": []}


def check(results: list[dict], texts: list[str]) -> dict:
    lost = duplicated = disordered = 0
    for result, text in zip(results, texts):
        seqs = result["seqs"]
        duplicated += len(seqs) - len(set(seqs))
        disordered += sum(1 for a, b in zip(seqs, seqs[1:]) if b < a)
        got = "".join(result["text"])
        if got != text:
            lost += max(1, len(text.split()) - len(got.split()))
    return {"lost": lost, "duplicated": duplicated, "out_of_order": disordered}
