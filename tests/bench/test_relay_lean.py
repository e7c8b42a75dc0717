"""The relay benchmark's lean event-stream reader (bench/relay/lean.py): whole SSE events
out of a chunked body however its bytes arrive, and a short run through it that loses,
repeats and reorders nothing."""

import asyncio
import math

import pytest

from bench import relay
from bench.relay.lean import EventProtocol

BODY = (
    ": padding\n\n"
    "event: stream-open\ndata: {}\n\n"
    'event: token\nid: 17\ndata: {"text": "caf\u00e9"}\n\n'
    "data: one\ndata: two\n\n"
).encode()


def _chunked(body: bytes, size: int) -> bytes:
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return head + framed + b"0\r\n\r\n"


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
@pytest.mark.parametrize("read", [1, 5, 64, 4096])
def test_events_come_out_whole_however_the_bytes_are_framed_and_read(chunk, read):
    async def run():
        protocol = EventProtocol()
        wire = _chunked(BODY, chunk)
        for i in range(0, len(wire), read):
            protocol.data_received(wire[i : i + read])
        return protocol

    protocol = asyncio.run(run())
    assert protocol.complete
    events = [(event, data, event_id) for event, data, _, event_id in protocol.payloads]
    assert events == [
        ("stream-open", "{}", None),
        ("token", '{"text": "caf\u00e9"}', "17"),
        ("message", "one\ntwo", None),
    ]


@pytest.mark.live
def test_a_short_run_read_by_the_lean_reader_loses_nothing():
    args = relay.parse_args(
        ["--streams", "20", "--tokens", "10", "--rate", "40", "--idle", "0", "--sends", "0"]
        + ["--client", "lean"]
    )
    out = relay.run(args)
    for row in out["rows"]:
        assert (row["lost"], row["duplicated"], row["out_of_order"], row["errors"]) == (0, 0, 0, 0)
        assert row["received"] == row["sent"] == 20 * 10
        assert math.isfinite(row["p99_ms"])  # the tokens carried their production time
