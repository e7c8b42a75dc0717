"""Publishing to the Redis log from the event loop (chat/streaming/delivery.py): a loop
turn's events go out in one script call and one announcement, in order, to this process's
streams at once and to the others through pub/sub. Skipped when Redis is absent."""

import asyncio
import json
import time
import uuid

import pytest

from chat.streaming import delivery, redis_log
from chat.streaming.eventstream import Subscription
from tests.support.processes import free_port
from tests.support.redis_server import REDIS_URL, require_redis


@pytest.fixture
def redis_url(settings):
    require_redis(REDIS_URL)
    settings.REDIS_URL = REDIS_URL
    settings.EVENTSTREAM_STORAGE_CLASS = "chat.streaming.redis_log.RedisEventStorage"
    settings.EVENTLOG_MAX_EVENTS_PER_CHANNEL = 100
    delivery.forget_publisher()
    yield REDIS_URL
    delivery.forget_publisher()


def channels(count: int) -> list[str]:
    """Channel names of this test alone: the Redis log outlives the test."""
    prefix = uuid.uuid4().hex
    return [f"{prefix}-{i}" for i in range(count)]


async def _announcements(pubsub, count: int) -> list[bytes]:
    out = []
    deadline = asyncio.get_running_loop().time() + 5
    while len(out) < count and asyncio.get_running_loop().time() < deadline:
        message = await pubsub.get_message(timeout=0.5)
        if message is not None and message["type"] == "message":
            out.append(message["data"])
    return out


def test_a_loop_turns_events_go_out_in_one_call_in_order_and_reach_the_log(redis_url):
    from redis.asyncio import Redis

    from chat.streaming.redis_log import RedisEventStorage

    a, b = channels(2)
    log = RedisEventStorage()
    starts = {c: log.get_current_id(c) for c in (a, b)}

    async def publish_in_one_turn():
        listener = Redis.from_url(redis_url).pubsub()
        await listener.subscribe(redis_log.TOPIC)
        done = []
        publisher = delivery.publisher()
        for channel, text in [(a, "one"), (b, "x"), (a, "two"), (a, "three")]:
            data = json.dumps({"text": text})
            publisher.publish(channel, "token", data, lambda e, err: done.append((e, err)))
        while len(done) < 4:
            await asyncio.sleep(0.01)
        heard = await _announcements(listener, 1)
        await listener.aclose()
        return done, heard

    done, heard = asyncio.run(publish_in_one_turn())
    assert [error for _, error in done] == [None] * 4
    assert [(e.channel, json.loads(e.data)["text"]) for e, _ in done] == [
        (a, "one"),
        (b, "x"),
        (a, "two"),
        (a, "three"),
    ]
    assert [e.id for e, _ in done if e.channel == a] == [
        starts[a] + 1,
        starts[a] + 2,
        starts[a] + 3,
    ]
    assert [e.id for e, _ in done if e.channel == b] == [starts[b] + 1]
    # One announcement for the four, from this process, in the order of the ids.
    assert len(heard) == 1
    origin, events = redis_log.announced(heard[0])
    assert origin == delivery.ORIGIN
    assert [(e.channel, e.id, e.data) for e in events] == [
        (e.channel, e.id, e.data) for e, _ in done
    ]
    replayed = log.get_events(a, starts[a])
    assert [json.loads(e.data)["text"] for e in replayed] == ["one", "two", "three"]


def test_this_process_streams_get_its_events_when_published_and_others_from_pub_sub(redis_url):
    (channel,) = channels(1)

    async def run():
        subscription = Subscription(channel, user_id=1)
        subscription.open()
        try:
            event = await delivery.publisher().apublish(channel, "token", '{"text": "mine"}')
            mine, _ = subscription.take()
            # Its own announcement is skipped: delivered above already.
            delivery.deliver(f"{delivery.ORIGIN}\n{event.id}\n{channel}\ntoken\nx".encode())
            assert subscription.take() == ([], False)
            # Another process's announcement reaches this process's stream.
            other = f"{uuid.uuid4().hex}\n{event.id + 1}\n{channel}\ntoken\n" + '{"text": "theirs"}'
            delivery.deliver(other.encode())
            theirs, _ = subscription.take()
            return mine, theirs
        finally:
            subscription.close()

    mine, theirs = asyncio.run(run())
    assert [e.data for e in mine] == ['{"text": "mine"}']
    assert [(e.id, e.data) for e in theirs] == [(mine[0].id + 1, '{"text": "theirs"}')]


def test_when_redis_fails_the_batch_and_all_queued_behind_it_fail(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens
    delivery.forget_publisher()
    (channel,) = channels(1)

    async def run():
        results = []
        publisher = delivery.publisher()
        for i in range(3):
            publisher.publish(channel, "token", f'{{"i": {i}}}', lambda e, err: results.append(err))
        while len(results) < 3:
            await asyncio.sleep(0.01)
        with pytest.raises(Exception) as raised:
            await publisher.apublish(channel, "message.end", "{}")
        return results, raised.value

    try:
        results, later = asyncio.run(run())
    finally:
        delivery.forget_publisher()
    assert all(isinstance(error, Exception) for error in results)
    assert later is not None


def test_data_with_a_newline_is_refused_rather_than_announced_wrong(redis_url):
    async def run():
        with pytest.raises(ValueError):
            delivery.publisher().publish("c", "token", "a\nb", lambda e, err: None)

    asyncio.run(run())


def test_the_publisher_sends_its_script_whole_when_redis_has_forgotten_it(redis_url):
    import redis

    (channel,) = channels(1)

    async def run():
        publisher = delivery.publisher()
        first = await publisher.apublish(channel, "token", '{"n": 1}')
        redis.Redis.from_url(redis_url).script_flush()  # as a restarted server would have
        second = await publisher.apublish(channel, "token", '{"n": 2}')
        return first, second

    first, second = asyncio.run(run())
    assert second.id == first.id + 1


def test_the_publisher_opens_a_new_connection_once_redis_has_dropped_its_own(redis_url):
    import redis

    (channel,) = channels(1)

    async def run():
        publisher = delivery.publisher()
        first = await publisher.apublish(channel, "token", '{"n": 1}')
        own = await publisher.connection.call("CLIENT", "ID")
        redis.Redis.from_url(redis_url).client_kill_filter(_id=own)
        await asyncio.wait_for(publisher.connection.lost, 5)
        second = await publisher.apublish(channel, "token", '{"n": 2}')
        return first, second

    first, second = asyncio.run(run())
    assert second.id == first.id + 1


def test_the_feed_hands_other_processes_events_to_this_processs_streams_across_a_dropped_connection(
    redis_url,
):
    import redis

    (channel,) = channels(1)
    other_process = uuid.uuid4().hex
    sender = redis.Redis.from_url(redis_url)

    def announce(event_id: int, text: str) -> None:
        payload = f'{other_process}\n{event_id}\n{channel}\ntoken\n{{"text": "{text}"}}'
        sender.publish(redis_log.TOPIC, payload)

    async def heard(subscription, count: int) -> list:
        events, deadline = [], time.monotonic() + 5
        while len(events) < count and time.monotonic() < deadline:
            events += subscription.take()[0]
            await asyncio.sleep(0.01)
        return events

    async def run():
        feed = delivery.RedisFeed()
        task = asyncio.ensure_future(delivery._deliver(feed))
        subscription = Subscription(channel, user_id=1)
        subscription.open()
        try:
            while not delivery._ready.is_set():
                await asyncio.sleep(0.01)
            announce(1, "before")
            before = await heard(subscription, 1)
            old = feed.connection
            host, port = old.transport.get_extra_info("sockname")[:2]
            sender.client_kill_filter(addr=f"{host}:{port}")
            await asyncio.wait_for(old.lost, 5)
            deadline = time.monotonic() + 10  # the feed waits a second, then subscribes again
            while feed.connection in (None, old) or not delivery._ready.is_set():
                assert time.monotonic() < deadline, "the feed did not subscribe again"
                await asyncio.sleep(0.05)
            announce(2, "after")
            after = await heard(subscription, 1)
            return before, after
        finally:
            subscription.close()
            task.cancel()
            delivery._ready.clear()

    before, after = asyncio.run(run())
    assert [(e.id, e.data) for e in before] == [(1, '{"text": "before"}')]
    assert [(e.id, e.data) for e in after] == [(2, '{"text": "after"}')]
