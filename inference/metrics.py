"""Prometheus metrics, one CollectorRegistry per app (several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "inference_requests", "Chat completion requests by outcome", ["outcome"], registry=r
        )
        self.tokens = Counter("inference_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "inference_time_to_first_token_seconds", "Request arrival to first token",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "inference_inter_token_latency_seconds", "Time between tokens of one stream",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        Gauge("inference_running_sequences", "Sequences in the batch", registry=r).set_function(
            lambda: float(running())
        )
        Gauge("inference_queue_depth", "Requests waiting for a slot", registry=r).set_function(
            lambda: float(waiting())
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
