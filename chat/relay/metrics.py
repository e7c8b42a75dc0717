"""Prometheus figures for the site's relays (served at /metrics, for staff and scrapers)."""

import bisect
import time

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

REGISTRY = CollectorRegistry(auto_describe=True)
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.active = Gauge(
            "tokenstream_relays_active", "Replies being relayed now", registry=registry
        )
        self.started = Counter(
            "tokenstream_relays_started_total", "Replies whose relay started", registry=registry
        )
        self.finished = Counter(
            "tokenstream_replies_finished_total",
            "Replies ended, by final status",
            ["status"],
            registry=registry,
        )
        # A plain count read at scrape time: a Counter takes a lock for every token event,
        # which showed in the relay's profile. Only the event loop's thread adds to it.
        self.token_events = 0
        registry.register(_TokenEvents(self))
        self.latency = PlainHistogram(
            "tokenstream_relay_latency_seconds",
            "From the inference server producing a token to the site publishing it",
            buckets=LATENCY_BUCKETS,
        )
        registry.register(self.latency)
        self.reconnects = Counter(
            "tokenstream_stream_reconnects_total",
            "Event stream requests that resumed with Last-Event-ID",
            registry=registry,
        )
        self.failures = Counter(
            "tokenstream_relay_failures_total",
            "Relay failures, by kind",
            ["kind"],
            registry=registry,
        )

    def relay_started(self) -> None:
        self.started.inc()
        self.active.inc()

    def relay_ended(self) -> None:
        self.active.dec()

    def token_event(self, produced_at: float | None) -> None:
        self.token_events += 1
        if produced_at is not None:
            self.latency.observe(max(0.0, time.monotonic() - produced_at))

    def reply_finished(self, status: str, failure_kind: str | None) -> None:
        self.finished.labels(status=status).inc()
        if failure_kind:
            self.failure(failure_kind)

    def failure(self, kind: str) -> None:
        self.failures.labels(kind=kind).inc()


class _TokenEvents:
    """The token event counter as the registry collects it."""

    def __init__(self, metrics: RelayMetrics) -> None:
        self.metrics = metrics

    def collect(self):
        yield CounterMetricFamily(
            "tokenstream_token_events", "Token events published", value=self.metrics.token_events
        )


class PlainHistogram:
    """A histogram as prometheus_client's Histogram exposes it, kept as plain counts read at
    scrape time (as the token counter): its observe() takes two locks, for every token
    event. Only the event loop's thread observes."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self):
        counts, total, buckets = list(self.counts), 0, []
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            total += count
            buckets.append((floatToGoString(bound), total))
        yield HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=self.sum
        )


METRICS = RelayMetrics(REGISTRY)
