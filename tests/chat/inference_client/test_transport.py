"""The lean streaming client's protocol (chat/inference_client/transport.py): payloads its
reader's fast path takes straight from a read, and the order kept with those it queues."""

import asyncio

from chat.inference_client.transport import StreamProtocol

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"


def protocol_taking_text(taken: list) -> StreamProtocol:
    protocol = StreamProtocol()

    def fast(payload: bytes) -> bool:
        if payload.startswith(b"text"):
            taken.append(payload)
            return True
        return False

    protocol.fast = fast
    return protocol


def test_a_payload_behind_a_queued_one_is_queued_too_so_order_holds():
    taken = []
    protocol = protocol_taking_text(taken)
    protocol.data_received(HEAD + b"data: text1\n\ndata: other\n\ndata: text2\n\n")
    assert taken == [b"text1"]
    assert list(protocol.payloads) == [b"other", b"text2"]
    protocol.payloads.clear()  # the reader took them
    protocol.data_received(b"data: text3\n\n")
    assert taken == [b"text1", b"text3"]


def test_a_read_whose_payloads_were_all_taken_wakes_no_reader():
    loop = asyncio.new_event_loop()
    try:
        protocol = protocol_taking_text([])
        protocol.data_received(HEAD)
        protocol.waiter = loop.create_future()
        protocol.data_received(b"data: text1\n\ndata: tex")
        protocol.data_received(b"t2\n\n")
        assert not protocol.waiter.done()
        protocol.data_received(b"data: [DONE]\n\n")
        assert protocol.waiter.done() and list(protocol.payloads) == [b"[DONE]"]
    finally:
        loop.close()


def test_without_a_fast_path_every_payload_is_queued_and_wakes_the_reader():
    loop = asyncio.new_event_loop()
    try:
        protocol = StreamProtocol()
        protocol.data_received(HEAD)
        protocol.waiter = loop.create_future()
        protocol.data_received(b"data: text1\n\n")
        assert protocol.waiter.done() and list(protocol.payloads) == [b"text1"]
    finally:
        loop.close()
