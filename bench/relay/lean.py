"""The benchmark's lean event-stream reader (`--client lean`): the site's own HTTP/1.1
stream parser (chat/inference_client/transport.py) with whole SSE events, stamped with
their arrival when the bytes are read.

Read through httpx, the benchmark's 400 event streams of 20 tokens/s cost the benchmark
process 64-72% of a core on a 2-core machine (bench/README.md, issue 18's nineteenth round),
beside the site, Redis, PostgreSQL and the fake model server on the same two cores: the
site's round then ran on a machine about full, which the direct reads' round (without the
site beside it) did not. A page's EventSource runs in a browser on another machine. Both
rounds read through the same client either way, so the comparison stays like for like.
"""

import asyncio
import codecs
import time
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httpx

from chat.inference_client.transport import StreamClosed, StreamProtocol, StreamResponse


class EventProtocol(StreamProtocol):
    """StreamProtocol's framing; the body split into SSE events, each (event, data,
    arrival, id) queued in `payloads` as it completes (which wakes the reader)."""

    def __init__(self) -> None:
        super().__init__()
        self._text = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def _feed_lines(self, data: bytes) -> None:
        text = self._text + self._decoder.decode(data)
        if "\n\n" not in text:
            self._text = text
            return
        *blocks, self._text = text.split("\n\n")
        arrived = time.monotonic()
        for block in blocks:
            event, data, event_id = parse_block(block)
            if data or event != "message":
                self.payloads.append((event, data, arrived, event_id))


def parse_block(block: str) -> tuple[str, str, str | None]:
    """An SSE event's (event, data, id) from its lines (comments and unknown fields
    ignored; data lines joined by newlines)."""
    event, lines, event_id = "message", [], None
    for line in block.split("\n"):
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            lines.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            event_id = value
    return event, "\n".join(lines), event_id


@asynccontextmanager
async def stream(client: httpx.AsyncClient, method: str, path: str, json_body: bytes = b""):
    """`client`'s request (its base URL and cookies) as a lean stream: yields an async
    iterator of its events."""
    url = urlsplit(str(client.base_url.join(path)))
    head = [
        f"{method} {url.path}{'?' + url.query if url.query else ''} HTTP/1.1",
        f"Host: {url.hostname}:{url.port}",
        "Accept: text/event-stream",
        "Connection: close",
    ]
    cookies = "; ".join(f"{name}={value}" for name, value in client.cookies.items())
    if cookies:
        head.append(f"Cookie: {cookies}")
    if method == "POST":
        head += ["Content-Type: application/json", f"Content-Length: {len(json_body)}"]
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(EventProtocol, url.hostname, url.port)
    try:
        transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + json_body)
        while protocol.status is None:
            if protocol.closed is not None:
                raise StreamClosed("the server closed the connection before answering")
            await protocol.wait()
        # its sse_data hands out whatever the protocol queued: here, whole events
        yield StreamResponse(protocol).sse_data()
    finally:
        transport.abort()
