"""A lean Redis connection for the event path: RESP2 over one asyncio connection.

The relay's publisher makes one script call per event loop turn, and every site process
reads every announcement. Through redis-py's asyncio client a call cost the site ~125 µs of
CPU, plus ~8 µs for each event in it (five arguments each to pack, a reply of ids to
parse), where this connection costs ~45 µs and well under 1 µs an event (bench/README.md,
issue 18's nineteenth round). What the event path needs is small: calls answered in the
order they were sent, and a subscription's messages; everything else in the site (sessions,
the Channels layer) keeps redis-py.

REDIS_URL means here what it means to redis-py (its own parse_url reads it): redis://,
rediss:// (TLS, with its ssl_* options) and unix://, a username and password, a database.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import RedisSSLContext, SSLConnection, parse_url

CONNECT_TIMEOUT = 5.0
CRLF = b"\r\n"


class RedisError(Exception):
    """An error reply from Redis (its text, as `-ERR ...` said it)."""


class ConnectionLost(ConnectionError):
    """The connection closed with calls still waiting for their replies."""


class Incomplete(Exception):
    """Not all of a reply has arrived yet."""


def parse(buf: bytes | bytearray, pos: int = 0) -> tuple[Any, int]:
    """One RESP2 reply at `pos`: (value, the position after it). Integers as int, simple
    and bulk strings as bytes (a nil as None), arrays as lists, an error reply as a
    RedisError (returned, not raised: it answers one call). Incomplete if it has not
    all arrived."""
    end = buf.find(CRLF, pos)
    if end < 0:
        raise Incomplete
    kind, line = buf[pos], buf[pos + 1 : end]
    if kind == 0x24:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buf) < stop + 2:
            raise Incomplete
        return bytes(buf[end + 2 : stop]), stop + 2
    if kind == 0x3A:  # : integer
        return int(line), end + 2
    if kind == 0x2A:  # * array
        count, pos = int(line), end + 2
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == 0x5F:  # _ RESP3's nil (a GET's reply on a connection that said HELLO 3)
        return None, end + 2
    if kind == 0x2B:  # + simple string
        return bytes(line), end + 2
    if kind == 0x2D:  # - error
        return RedisError(bytes(line).decode(errors="replace")), end + 2
    raise ValueError(f"not a RESP2 reply: {bytes(buf[pos : pos + 20])!r}")


def pack(args: tuple[Any, ...]) -> bytes:
    """A command as RESP2 (an array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif not isinstance(arg, bytes):
            arg = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


class Connection(asyncio.Protocol):
    """One connection: `call` answers calls in order; after `subscribe`, every message on
    the topic goes to its handler. `lost` completes when the connection closes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiting: deque[asyncio.Future] = deque()
        self.on_message: Callable[[bytes], None] | None = None
        self.lost: asyncio.Future = asyncio.get_running_loop().create_future()

    async def call(self, *args: Any, timeout: float | None = None) -> Any:
        """Sends one command; its reply (a RedisError reply raised). Unanswered within
        `timeout` seconds, it and every call behind it fail with TimeoutError and the
        connection closes (a late reply would answer the wrong call)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLost("the connection to Redis is closed")
        loop = asyncio.get_running_loop()
        reply = loop.create_future()
        self.waiting.append(reply)
        self.transport.write(pack(args))
        # a timer rather than asyncio.wait_for, which makes a task of every call
        timer = None if timeout is None else loop.call_later(timeout, self._timed_out, timeout)
        try:
            value = await reply
        finally:
            if timer is not None:
                timer.cancel()
        if isinstance(value, RedisError):
            raise value
        return value

    async def subscribe(self, topic: str, on_message: Callable[[bytes], None]) -> None:
        """Every message published on `topic` from now on goes to `on_message(payload)`,
        on the loop, in order; nothing else is sent on this connection afterwards."""
        self.on_message = on_message
        await self.call("SUBSCRIBE", topic)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        pos = 0
        try:
            while pos < len(buffer):
                value, pos = parse(buffer, pos)
                self._reply(value)
        except Incomplete:
            pass
        except ValueError as exc:  # out of step with the server: nothing after it is sure
            self._fail(ConnectionLost(f"unreadable reply from Redis: {exc}"))
            self.close()
        del buffer[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionLost(f"the connection to Redis closed ({exc or 'by the server'})"))
        if not self.lost.done():
            self.lost.set_result(exc)

    def _reply(self, value: Any) -> None:
        # Subscribed, messages are pushed among the replies: [b"message", topic, payload].
        if self.on_message is not None and type(value) is list and value[0] == b"message":
            self.on_message(value[2])
        elif self.waiting:
            reply = self.waiting.popleft()
            if not reply.done():
                reply.set_result(value)

    def _timed_out(self, timeout: float) -> None:
        self._fail(TimeoutError(f"Redis did not answer within {timeout:g} s"))
        self.close()

    def _fail(self, error: Exception) -> None:
        while self.waiting:
            reply = self.waiting.popleft()
            if not reply.done():
                reply.set_exception(error)


async def connect(url: str, timeout: float = CONNECT_TIMEOUT) -> Connection:
    """A connection to REDIS_URL's server, signed in and on its database."""
    options = parse_url(url)
    loop = asyncio.get_running_loop()
    if "path" in options:
        opening = loop.create_unix_connection(Connection, options["path"])
    else:
        host, port = options.get("host", "localhost"), options.get("port", 6379)
        tls = _tls(options) if options.get("connection_class") is SSLConnection else None
        opening = loop.create_connection(
            Connection, host, port, ssl=tls, server_hostname=host if tls else None
        )
    _, connection = await asyncio.wait_for(opening, timeout)
    try:
        if options.get("password") is not None:
            auth = [options["username"]] if options.get("username") else []
            await asyncio.wait_for(connection.call("AUTH", *auth, options["password"]), timeout)
        if options.get("db"):
            await asyncio.wait_for(connection.call("SELECT", options["db"]), timeout)
    except BaseException:
        connection.close()
        raise
    return connection


def _tls(options: dict[str, Any]):
    """The TLS context redis-py's SSLConnection would make of these URL options."""
    return RedisSSLContext(
        keyfile=options.get("ssl_keyfile"),
        certfile=options.get("ssl_certfile"),
        cert_reqs=options.get("ssl_cert_reqs", "required"),
        ca_certs=options.get("ssl_ca_certs"),
        ca_path=options.get("ssl_ca_path"),
        check_hostname=options.get("ssl_check_hostname", True),
    ).get()
