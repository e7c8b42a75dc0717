"""An event stream's body written straight to its socket under daphne, past the layers that
cost more than the write itself.

Every token event of every open stream is one body message. Through daphne's `send` it
passes daphne's `Server.handle_reply` (a coroutine) and `WebRequest.handle_reply`, Twisted's
`Request.write` (chunked framing in three pieces), the connection's `writeSequence`, which
registers the socket with the loop for writing, and on the next loop turn the reactor's
write callback, `doWrite` and the socket's unregistration: at 200 streams that was the
largest part of the site's CPU per relayed token. When nothing is waiting in the
connection's buffer, the chunk can go to the socket at once, which is what that callback
would do one loop turn later; whatever the socket does not take goes to the connection's own
buffer, and every later chunk follows it there, so the bytes keep their order.

This reads daphne's and Twisted's internals, not a public API (daphne pinned in
requirements.txt, Twisted through it); an upgrade must re-check exactly this module:

- `functools.partial(Server.handle_reply, protocol)`: the `send` daphne hands the app, and
  `protocol` the `daphne.http_protocol.WebRequest` (Twisted's `http.Request`): `finished`,
  `_disconnected`, `startedWriting`, `chunked`, `sentLength`, `channel.transport`;
- a plain TCP connection, `twisted.internet.tcp.Server` (TLS and HTTP/2 are left to
  Twisted): `connected`, `disconnecting`, `_writeDisconnected`, `TLS`, `socket`, and its
  buffer `dataBuffer`, `offset`, `_tempDataBuffer`.

Anything else (another server, a test's communicator, TLS) keeps the ordinary `send`.
"""

import functools

try:
    from daphne.http_protocol import WebRequest
    from twisted.internet.tcp import Server as TcpServer
except ImportError:  # another ASGI server: the ordinary `send` throughout
    WebRequest = TcpServer = None


class SocketWriter:
    """write(body) sends one body chunk of a started, chunked response, and returns False
    when it cannot (the caller then uses `send`, which also handles a gone client)."""

    def __init__(self, request) -> None:
        self.request = request

    @classmethod
    def for_send(cls, send) -> "SocketWriter | None":
        if WebRequest is None or not isinstance(send, functools.partial) or not send.args:
            return None
        request = send.args[0]
        if not isinstance(request, WebRequest):
            return None
        return cls(request)

    def write(self, body: bytes) -> bool:
        request = self.request
        if request.finished or request._disconnected or not request.startedWriting:
            return False
        if not request.chunked or request.channel is None:
            return False
        transport = request.channel.transport
        if (
            type(transport) is not TcpServer
            or transport.TLS
            or not transport.connected
            or transport.disconnecting
            or transport._writeDisconnected
            or len(transport.dataBuffer) > transport.offset
            or transport._tempDataBuffer
        ):
            return False
        frame = b"%x\r\n%b\r\n" % (len(body), body)
        try:
            sent = transport.socket.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            return False  # the connection broke: Twisted finds out and ends the stream
        request.sentLength += len(body)
        if sent < len(frame):
            transport.write(frame[sent:])  # buffered, written when the socket takes it
        return True
