"""The event logs django-eventstream replays from: one contract, run against the in-memory
log (one process) and the Redis log (several processes; skipped when Redis is absent)."""

import json
import uuid

import pytest

from chat.streaming import memory_log
from chat.streaming.channels import conversation_id_from_channel
from chat.streaming.eventstream import EventDoesNotExist
from chat.streaming.memory_log import MemoryEventStorage
from tests.support.redis_server import REDIS_URL, require_redis


@pytest.fixture(params=["memory", "redis"])
def storage(request, settings):
    settings.EVENTLOG_MAX_EVENTS_PER_CHANNEL = 100
    if request.param == "memory":
        memory_log.forget_all_channels()
        return MemoryEventStorage()
    require_redis(REDIS_URL)
    settings.REDIS_URL = REDIS_URL
    from chat.streaming.redis_log import RedisEventStorage

    return RedisEventStorage()


@pytest.fixture
def name():
    """Channel names of this test alone: the Redis log outlives the test."""
    prefix = uuid.uuid4().hex
    return lambda short: f"{prefix}-{short}"


def test_ids_increase_by_one_from_the_current_id(storage, name):
    c = name("c")
    start = storage.get_current_id(c)
    ids = [storage.append_event(c, "token", json.dumps({"i": i})).id for i in range(5)]
    assert ids == list(range(start + 1, start + 6))
    assert storage.get_current_id(c) == ids[-1]


def test_get_events_returns_exactly_what_came_after_the_id(storage, name):
    c = name("c")
    start = storage.get_current_id(c)
    events = [storage.append_event(c, "token", json.dumps({"i": i})) for i in range(10)]
    missed = storage.get_events(c, events[3].id, limit=100)
    assert [json.loads(e.data)["i"] for e in missed] == [4, 5, 6, 7, 8, 9]
    assert storage.get_events(c, events[-1].id) == []
    assert [json.loads(e.data)["i"] for e in storage.get_events(c, start, limit=3)] == [0, 1, 2]


def test_an_id_from_before_a_restart_is_unknown_and_not_mistaken_for_a_new_one(settings):
    storage = MemoryEventStorage()
    c = "c"
    storage.append_event(c, "token", json.dumps({}))
    old_id = storage.get_current_id(c)
    memory_log.forget_all_channels()  # what a restart does to memory
    storage.append_event(c, "token", json.dumps({}))
    with pytest.raises(EventDoesNotExist):
        storage.get_events(c, old_id)


def test_a_trimmed_id_is_unknown_but_recent_ones_replay(storage, name):
    c = name("c")
    first = storage.append_event(c, "token", json.dumps({"i": 0}))
    for i in range(1, 200):
        last = storage.append_event(c, "token", json.dumps({"i": i}))
    with pytest.raises(EventDoesNotExist) as raised:
        storage.get_events(c, first.id)
    assert raised.value.current_id == last.id
    assert [json.loads(e.data)["i"] for e in storage.get_events(c, last.id - 2)] == [198, 199]


def test_channels_are_independent(storage, name):
    a = storage.append_event(name("a"), "token", json.dumps({"ch": "a"}))
    storage.append_event(name("b"), "token", json.dumps({"ch": "b"}))
    assert storage.get_events(name("a"), a.id) == []


def test_idle_channels_are_forgotten():
    memory_log.forget_all_channels()
    storage = MemoryEventStorage()
    storage.append_event("idle", "token", json.dumps({}))
    assert memory_log.forget_idle_channels(-1) == 1
    assert "idle" not in memory_log.known_channels()


def test_channel_names_parse_to_conversation_ids():
    assert conversation_id_from_channel("conversation-nope") is None
    assert conversation_id_from_channel("other-" + "0" * 32) is None
    assert str(conversation_id_from_channel("conversation-" + "1" * 32)) == (
        "11111111-1111-1111-1111-111111111111"
    )


def fill(storage, channel: str, events: int, size: int = 1000):
    return [
        storage.append_event(channel, "token", json.dumps({"t": "x" * size})) for _ in range(events)
    ]


def test_the_memory_log_is_bounded_in_bytes_across_channels_evicting_the_least_recently_used(
    settings,
):
    settings.EVENTLOG_MAX_BYTES = 50_000
    memory_log.forget_all_channels()
    storage = MemoryEventStorage()
    fill(storage, "old", 10)
    kept = fill(storage, "read", 10)
    for number in range(20):
        storage.get_events("read", kept[-1].id)  # a stream still reading keeps it recent
        fill(storage, f"busy{number}", 5)
    assert memory_log.kept_bytes() <= 50_000
    assert "old" not in memory_log.known_channels()
    assert "read" in memory_log.known_channels()
    assert storage.get_events("read", kept[4].id) == kept[5:]


def test_one_channel_larger_than_the_bound_keeps_only_its_newest_events(settings):
    settings.EVENTLOG_MAX_BYTES = 20_000
    memory_log.forget_all_channels()
    storage = MemoryEventStorage()
    events = fill(storage, "huge", 100)
    assert memory_log.kept_bytes() <= 20_000
    assert storage.get_events("huge", events[-3].id) == events[-2:]
    with pytest.raises(EventDoesNotExist):
        storage.get_events("huge", events[0].id)


def test_a_reader_of_an_evicted_channel_gets_reset_and_then_only_new_events(settings):
    settings.EVENTLOG_MAX_BYTES = 30_000
    memory_log.forget_all_channels()
    storage = MemoryEventStorage()
    seen = fill(storage, "mine", 3)
    for number in range(10):
        fill(storage, f"other{number}", 5)
    assert "mine" not in memory_log.known_channels()
    later = storage.append_event("mine", "token", json.dumps({"t": "later"}))
    with pytest.raises(EventDoesNotExist) as reset:
        storage.get_events("mine", seen[-1].id)
    assert reset.value.current_id == later.id > seen[-1].id
    assert storage.get_events("mine", reset.value.current_id) == []
