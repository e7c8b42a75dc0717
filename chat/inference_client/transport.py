"""A lean HTTP/1.1 client for one streaming request: the relay's hot path.

Reading a reply's token chunks through httpx cost most of the site's CPU per relayed token
(its connection pool, anyio stream wrappers that pause and resume reading on every chunk,
and the response iterators: ~27% of the site process at 200 streams). Here an asyncio
Protocol receives the bytes, undoes chunked framing and splits server-sent-event lines in
place, and hands the `data:` payloads to the reader: one callback per network read.
It speaks exactly what an OpenAI-compatible stream needs: a POST with a JSON body, one
connection per request (`Connection: close`), a body framed by chunks, a Content-Length or
the connection's end. Everything else (model lists, probes) still goes through httpx.
"""

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit

HEAD_LIMIT = 64 * 1024


class StreamClosed(ConnectionError):
    """The connection ended before the response did."""


class StreamProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()  # the whole body, kept only for error statuses
        self.payloads: deque[bytes] = deque()
        self.complete = False  # the body ended as framed (not cut off)
        self.closed: Exception | None = None
        self.waiter: asyncio.Future | None = None
        self._lines = b""
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still to come; -1: its CRLF
        self._length: int | None = None
        self._frame = b""
        # fast(payload) -> bool: takes a payload in data_received itself when nothing is
        # queued before it (so order holds); False leaves it to the queue and the reader.
        self.fast = None

    # --- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.status is None:
            data = self._read_head(data)
            if self.status is None:
                return
            self._wake()  # open_stream waits for the head
        if data:
            self._read_body(data)
        # A read whose payloads all went to `fast` wakes nobody: that is its point.
        if self.payloads or self.complete or self.status >= 400:
            self._wake()

    def connection_lost(self, exc) -> None:
        if not self.complete and self._length is None and not self._chunked and self.status:
            self.complete = True  # a body delimited by the connection's end
            self._feed_lines(b"\n")
        self.closed = exc or StreamClosed("the server closed the connection")
        self._wake()

    # --- parsing -----------------------------------------------------------------------
    def _read_head(self, data: bytes) -> bytes:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > HEAD_LIMIT:
                self.transport.abort()
            return b""
        lines = bytes(self.head[:end]).split(b"\r\n")
        rest = bytes(self.head[end + 4 :])
        self.status = int(lines[0].split(b" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower()] = value.strip()
        self._chunked = b"chunked" in self.headers.get(b"transfer-encoding", b"").lower()
        if not self._chunked and b"content-length" in self.headers:
            self._length = int(self.headers[b"content-length"])
            if self._length == 0:
                self.complete = True
        return rest

    def _read_body(self, data: bytes) -> None:
        if not self._chunked:
            if self._length is not None:
                data = data[: self._length]
                self._length -= len(data)
                self.complete = self._length == 0
            self._deliver(data)
            return
        frame = self._frame + data if self._frame else data
        self._frame = b""
        position, size = 0, len(frame)
        while position < size and not self.complete:
            if self._chunk_left > 0:
                piece = frame[position : position + self._chunk_left]
                self._deliver(piece)
                position += len(piece)
                self._chunk_left -= len(piece)
                if self._chunk_left == 0:
                    self._chunk_left = -1
                continue
            end = frame.find(b"\r\n", position)
            if end < 0:
                self._frame = frame[position:]
                return
            if self._chunk_left == -1:  # the CRLF after a chunk's data
                self._chunk_left = 0
            else:
                self._chunk_left = int(frame[position:end].split(b";", 1)[0], 16)
                self.complete = self._chunk_left == 0
            position = end + 2

    def _deliver(self, data: bytes) -> None:
        if self.status >= 400:
            self.body += data
        else:
            self._feed_lines(data)

    def _feed_lines(self, data: bytes) -> None:
        if b"\n" not in data:
            self._lines += data
            return
        *lines, self._lines = (self._lines + data).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if self.payloads or self.fast is None or not self.fast(payload):
                    self.payloads.append(payload)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class StreamResponse:
    def __init__(self, protocol: StreamProtocol) -> None:
        self.protocol = protocol
        self.handed = 0  # payloads the reader's `fast` took (see StreamProtocol.fast)

    @property
    def status(self) -> int:
        return self.protocol.status

    async def read_body(self) -> bytes:
        """The whole body of an error response."""
        while not (self.protocol.complete or self.protocol.closed):
            await self.protocol.wait()
        return bytes(self.protocol.body)

    async def sse_data(self):
        """The `data:` payloads of the event stream, as bytes, until the body ends; raises
        StreamClosed if the connection drops first."""
        protocol = self.protocol
        while True:
            while protocol.payloads:
                yield protocol.payloads.popleft()
            if protocol.complete:
                return
            if protocol.closed is not None:
                raise StreamClosed(str(protocol.closed))
            await protocol.wait()

    def close(self) -> None:
        if self.protocol.transport is not None:
            self.protocol.transport.abort()


async def open_stream(url: str, body: bytes, headers: dict[str, str]) -> StreamResponse:
    """POST `body` to `url` and return once the response's status line and headers are in.
    Raises OSError (refused, reset) or TimeoutError from the caller's timeout."""
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(
        StreamProtocol,
        parts.hostname,
        port,
        ssl=ssl.create_default_context() if secure else None,
        server_hostname=parts.hostname if secure else None,
    )
    response = StreamResponse(protocol)
    try:
        transport.write(_request_head(parts, port, len(body), headers) + body)
        while protocol.status is None:
            if protocol.closed is not None:
                raise StreamClosed("the server closed the connection before answering")
            await protocol.wait()
    except BaseException:
        response.close()
        raise
    return response


def _request_head(parts, port: int, length: int, headers: dict[str, str]) -> bytes:
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.hostname}:{port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {length}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
