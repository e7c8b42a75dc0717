"""An event stream's body chunks written straight to a plain TCP connection under daphne
(chat/streaming/socket_write.py): framed as Twisted frames them, in order, and left to
Twisted whenever its buffer holds anything."""

import functools
import socket

import pytest
from twisted.internet import tcp

from chat.streaming.socket_write import SocketWriter, WebRequest


class Reactor:
    def __init__(self):
        self.writers = []

    def addWriter(self, writer):  # noqa: N802 (Twisted's name)
        self.writers.append(writer)


class Request:
    """The attributes of daphne's WebRequest that the writer reads."""

    finished = _disconnected = False
    startedWriting = chunked = 1
    sentLength = 0

    def __init__(self, transport):
        self.channel = type("Channel", (), {"transport": transport})()


@pytest.fixture
def connection():
    """A Twisted TCP connection over one end of a socket pair, as far as writing goes."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.settimeout(1)
    transport = tcp.Server.__new__(tcp.Server)
    transport.socket, transport.reactor = ours, Reactor()
    transport.connected, transport.disconnecting, transport._writeDisconnected = 1, 0, False
    transport.dataBuffer, transport.offset = b"", 0
    transport._tempDataBuffer, transport._tempDataLen = [], 0
    transport.producer, transport.streamingProducer = None, False
    yield transport, peer
    ours.close()
    peer.close()


def test_a_chunk_goes_to_the_socket_framed_as_chunked_encoding(connection):
    transport, peer = connection
    request = Request(transport)
    writer = SocketWriter(request)
    assert writer.write(b"event: token\ndata: {}\n\n")
    assert peer.recv(100) == b"17\r\nevent: token\ndata: {}\n\n\r\n"
    assert request.sentLength == 23 and transport.reactor.writers == []


def test_what_the_socket_does_not_take_is_left_to_twisted_and_so_is_every_later_chunk(
    connection,
):
    transport, peer = connection
    writer = SocketWriter(Request(transport))
    big = b"x" * (8 << 20)  # more than the socket buffers
    assert writer.write(big)
    assert transport._tempDataBuffer and transport.reactor.writers == [transport]
    # Twisted's buffer holds the rest: the next chunk must queue behind it, through `send`.
    assert not writer.write(b"next")


@pytest.mark.parametrize("state", ["finished", "disconnected", "not chunked", "closing"])
def test_a_response_that_cannot_take_a_chunk_now_is_left_to_send(connection, state):
    transport, _ = connection
    request = Request(transport)
    if state == "finished":
        request.finished = 1
    elif state == "disconnected":
        request._disconnected = True
    elif state == "not chunked":
        request.chunked = 0
    else:
        transport.disconnecting = 1
    assert not SocketWriter(request).write(b"data")


def test_only_daphnes_own_send_gets_a_writer():
    async def send(message):
        pass

    assert SocketWriter.for_send(send) is None
    assert SocketWriter.for_send(functools.partial(send)) is None
    request = WebRequest.__new__(WebRequest)
    assert SocketWriter.for_send(functools.partial(lambda r, m: None, request)).request is request
