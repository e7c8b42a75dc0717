"""The in-memory event log that django-eventstream reads replays from."""

import pytest
from django_eventstream.storage import EventDoesNotExist

from chat import eventlog
from chat.eventlog import MemoryEventStorage


@pytest.fixture
def storage(settings):
    settings.EVENTLOG_MAX_EVENTS_PER_CHANNEL = 100
    eventlog._channels.clear()
    return MemoryEventStorage()


def test_ids_increase_by_one_from_the_current_id(storage):
    start = storage.get_current_id("c")
    ids = [storage.append_event("c", "token", {"i": i}).id for i in range(5)]
    assert ids == list(range(start + 1, start + 6))
    assert storage.get_current_id("c") == ids[-1]


def test_get_events_returns_exactly_what_came_after_the_id(storage):
    start = storage.get_current_id("c")
    events = [storage.append_event("c", "token", {"i": i}) for i in range(10)]
    missed = storage.get_events("c", events[3].id, limit=100)
    assert [e.data["i"] for e in missed] == [4, 5, 6, 7, 8, 9]
    assert storage.get_events("c", events[-1].id) == []
    assert [e.data["i"] for e in storage.get_events("c", start, limit=3)] == [0, 1, 2]


def test_an_id_from_before_a_restart_is_unknown_and_not_mistaken_for_a_new_one(storage):
    storage.append_event("c", "token", {})
    old_id = storage.get_current_id("c")
    eventlog._channels.clear()  # what a restart does to memory
    storage.append_event("c", "token", {})
    with pytest.raises(EventDoesNotExist):
        storage.get_events("c", old_id)


def test_a_trimmed_id_is_unknown_but_recent_ones_replay(storage):
    first = storage.append_event("c", "token", {"i": 0})
    for i in range(1, 200):
        last = storage.append_event("c", "token", {"i": i})
    with pytest.raises(EventDoesNotExist) as raised:
        storage.get_events("c", first.id)
    assert raised.value.current_id == last.id
    assert [e.data["i"] for e in storage.get_events("c", last.id - 2)] == [198, 199]


def test_channels_are_independent(storage):
    a = storage.append_event("a", "token", {"ch": "a"})
    storage.append_event("b", "token", {"ch": "b"})
    assert storage.get_events("a", a.id) == []


def test_idle_channels_are_forgotten(storage):
    storage.append_event("idle", "token", {})
    assert eventlog.forget_idle_channels(-1) == 1
    assert "idle" not in eventlog._channels


def test_channel_names_parse_to_conversation_ids():
    assert eventlog.conversation_id_from_channel("conversation-nope") is None
    assert eventlog.conversation_id_from_channel("other-" + "0" * 32) is None
    assert str(eventlog.conversation_id_from_channel("conversation-" + "1" * 32)) == (
        "11111111-1111-1111-1111-111111111111"
    )
