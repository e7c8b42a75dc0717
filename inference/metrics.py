"""Prometheus metrics, one CollectorRegistry per app (several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from inference.scheduler import StepTimes

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(
        self,
        running: Callable[[], int],
        waiting: Callable[[], int],
        cache_stats: Callable[[], Any] = lambda: None,
        step_times: Callable[[], StepTimes] = StepTimes,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "inference_requests", "Chat completion requests by outcome", ["outcome"], registry=r
        )
        self.tokens = Counter("inference_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "inference_time_to_first_token_seconds",
            "Request arrival to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "inference_inter_token_latency_seconds",
            "Time between tokens of one stream",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        Gauge("inference_running_sequences", "Sequences in the batch", registry=r).set_function(
            lambda: float(running())
        )
        Gauge("inference_queue_depth", "Requests waiting for a slot", registry=r).set_function(
            lambda: float(waiting())
        )
        r.register(PrefixCacheCollector(cache_stats))
        r.register(StepTimesCollector(step_times))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class PrefixCacheCollector:
    """The prefix cache's counters, read from the engine at each scrape (zeros without one)."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()

        def get(name: str) -> float:
            return float(getattr(s, name, 0) or 0)

        p = "inference_prefix_cache"
        yield GaugeMetricFamily(
            f"{p}_bytes", "KV cache kept for reuse, in bytes", value=get("bytes")
        )
        yield GaugeMetricFamily(
            f"{p}_capacity_bytes", "Its bound (PREFIX_CACHE_MB)", value=get("capacity_bytes")
        )
        yield GaugeMetricFamily(f"{p}_blocks", "Cached blocks of 16 tokens", value=get("blocks"))
        yield GaugeMetricFamily(
            f"{p}_kept_reply_bytes",
            "The last cached reply's KV buffer, kept for its next turn (not in the bound)",
            value=get("kept_bytes"),
        )
        yield CounterMetricFamily(
            f"{p}_query_tokens", "Prompt tokens looked up in the cache", value=get("query_tokens")
        )
        yield CounterMetricFamily(
            f"{p}_hit_tokens", "Prompt tokens served from the cache", value=get("hit_tokens")
        )
        yield GaugeMetricFamily(
            f"{p}_hit_rate", "hit_tokens / query_tokens since start", value=get("hit_rate")
        )
        yield CounterMetricFamily(
            f"{p}_evicted_blocks",
            "Blocks evicted (least recently used first)",
            value=get("evicted_blocks"),
        )


class StepTimesCollector:
    """The model thread's seconds and steps by kind (inference.scheduler.StepTimes), read at
    each scrape: how much of its time went to prefill, decode and background work."""

    def __init__(self, times: Callable[[], StepTimes]) -> None:
        self._times = times

    def collect(self) -> Iterator[Metric]:
        t = self._times()
        seconds = CounterMetricFamily(
            "inference_model_step_seconds",
            "Time the model thread spent in steps of each kind",
            labels=["kind"],
        )
        steps = CounterMetricFamily(
            "inference_model_steps", "Model steps of each kind", labels=["kind"]
        )
        for kind in t.seconds:
            seconds.add_metric([kind], t.seconds[kind])
            steps.add_metric([kind], t.steps[kind])
        yield seconds
        yield steps
