"""The event path's lean Redis connection (chat/streaming/resp.py): replies read whole
however they arrive, calls answered in order, a subscription's messages, the URL's
password and database, and calls that fail rather than hang. The tests that talk to a
server skip when Redis is absent."""

import asyncio
import time

import pytest
import redis

from chat.streaming import resp
from tests.support.redis_server import REDIS_URL, require_redis

REPLIES = [
    (b":42\r\n", 42),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$0\r\n\r\n", b""),
    (b"$-1\r\n", None),
    (b"_\r\n", None),  # RESP3
    (b"+OK\r\n", b"OK"),
    (b"*3\r\n$7\r\nmessage\r\n$1\r\nt\r\n$4\r\na\r\nb\r\n", [b"message", b"t", b"a\r\nb"]),
    (b"*2\r\n*1\r\n:1\r\n*0\r\n", [[1], []]),
]


@pytest.mark.parametrize("wire,value", REPLIES)
def test_a_reply_is_read_whole_once_all_of_it_has_arrived(wire, value):
    for cut in range(len(wire)):
        with pytest.raises(resp.Incomplete):
            resp.parse(wire[:cut])
    assert resp.parse(wire + b":7\r\n") == (value, len(wire))


def test_an_error_reply_answers_its_call_as_an_error():
    error, end = resp.parse(b"-NOSCRIPT No matching script.\r\n")
    assert isinstance(error, resp.RedisError)
    assert str(error) == "NOSCRIPT No matching script."
    assert end == 31


def test_a_command_is_packed_as_bulk_strings_of_its_text():
    assert resp.pack(("SET", b"k\r\n", 3)) == b"*3\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$1\r\n3\r\n"


def test_calls_sent_together_are_answered_in_order_and_an_error_reply_raises():
    url = require_redis(REDIS_URL)

    async def run():
        connection = await resp.connect(url)
        try:
            key = f"resp-test-{time.time_ns()}"
            replies = await asyncio.gather(
                connection.call("SET", key, "x", "EX", 60),
                connection.call("APPEND", key, "yz"),
                connection.call("GET", key),
                connection.call("GET", key + "-missing"),
            )
            with pytest.raises(resp.RedisError, match="unknown command"):
                await connection.call("NO-SUCH-COMMAND")
            # the error answered its own call: the next one gets its own reply
            after = await connection.call("STRLEN", key)
            return replies, after
        finally:
            connection.close()

    replies, after = asyncio.run(run())
    assert replies == [b"OK", 3, b"xyz", None]
    assert after == 3


def test_messages_on_a_subscribed_topic_reach_the_handler_in_order():
    url = require_redis(REDIS_URL)
    topic = f"resp-test-{time.time_ns()}"

    async def run():
        heard: list[bytes] = []
        connection = await resp.connect(url)
        try:
            await connection.subscribe(topic, heard.append)
            sender = redis.Redis.from_url(url)
            for i in range(50):
                sender.publish(topic, f"message {i}" + "x" * (i * 1000))
            deadline = time.monotonic() + 5
            while len(heard) < 50 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return heard
        finally:
            connection.close()

    heard = asyncio.run(run())
    assert heard == [(f"message {i}" + "x" * (i * 1000)).encode() for i in range(50)]


def test_the_urls_password_and_database_are_used(redis_with_password):
    port = redis_with_password

    async def run():
        connection = await resp.connect(f"redis://:s3cret@127.0.0.1:{port}/3")
        try:
            await connection.call("SET", "where", "here")
        finally:
            connection.close()
        with pytest.raises(resp.RedisError, match="WRONGPASS|invalid"):
            await resp.connect(f"redis://:wrong@127.0.0.1:{port}/0")
        unsigned = await resp.connect(f"redis://127.0.0.1:{port}/0")
        try:
            with pytest.raises(resp.RedisError, match="NOAUTH"):
                await unsigned.call("GET", "where")
        finally:
            unsigned.close()

    asyncio.run(run())
    client = redis.Redis(port=port, password="s3cret", db=3)
    assert client.get("where") == b"here"
    assert redis.Redis(port=port, password="s3cret", db=0).get("where") is None


async def _server(on_connect):
    return await asyncio.start_server(on_connect, "127.0.0.1", 0)


def test_a_call_left_unanswered_fails_in_time_with_the_calls_behind_it():
    async def run():
        async def silent(reader, writer):
            await reader.read()  # reads until the client leaves, answers nothing

        server = await _server(silent)
        port = server.sockets[0].getsockname()[1]
        connection = await resp.connect(f"redis://127.0.0.1:{port}")
        started = time.monotonic()
        first = asyncio.ensure_future(connection.call("PING", timeout=0.2))
        second = asyncio.ensure_future(connection.call("PING"))
        results = await asyncio.gather(first, second, return_exceptions=True)
        waited = time.monotonic() - started
        await asyncio.wait_for(connection.lost, 5)
        server.close()
        return results, waited

    (first, second), waited = asyncio.run(run())
    assert isinstance(first, TimeoutError) and isinstance(second, TimeoutError)
    assert waited < 5


def test_a_connection_closed_by_the_server_fails_its_waiting_calls():
    async def run():
        async def hang_up(reader, writer):
            await reader.readline()
            writer.close()

        server = await _server(hang_up)
        port = server.sockets[0].getsockname()[1]
        connection = await resp.connect(f"redis://127.0.0.1:{port}")
        with pytest.raises(resp.ConnectionLost):
            await asyncio.wait_for(connection.call("PING"), 5)
        with pytest.raises(resp.ConnectionLost):
            await connection.call("PING")  # closed: refused at once, nothing sent
        server.close()

    asyncio.run(run())
