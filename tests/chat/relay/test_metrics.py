"""The relay's figures at /metrics (chat/relay/metrics.py): the latency histogram kept as
plain counts must read exactly as prometheus_client's own Histogram would."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from chat.relay.metrics import LATENCY_BUCKETS, PlainHistogram

NAME, HELP = "tokenstream_relay_latency_seconds", "From production to publishing"


def test_the_plain_latency_histogram_exposes_what_prometheus_clients_would():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainHistogram(NAME, HELP, LATENCY_BUCKETS)
    ours.register(plain)
    reference = Histogram(NAME, HELP, buckets=LATENCY_BUCKETS, registry=theirs)
    # the bounds themselves (le: at or below), between them, above all, and zero
    for value in (0.0, 0.001, 0.0015, 0.002, 0.03, 0.1, 1, 2.5, 2.6, 40.0, 0.25, 0.25):
        plain.observe(value)
        reference.observe(value)

    def lines(registry):
        # the reference also writes a _created sample: the moment it was made
        text = generate_latest(registry).decode()
        return [line for line in text.splitlines() if "_created" not in line]

    assert lines(ours) == lines(theirs)
    assert f'{NAME}_bucket{{le="+Inf"}} 12.0' in lines(ours)
