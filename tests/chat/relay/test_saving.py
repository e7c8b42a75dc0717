"""The relay's writes: batched saves of streamed text, and orphaned replies."""

import datetime

import pytest
from django.utils import timezone

from chat import services
from chat.models import Message
from chat.relay import saving
from chat.relay.manager import relay_manager
from tests.chat.relay import finish_scenarios
from tests.support.factories import create_conversation, create_message
from tests.support.postgres import json_from_child

pytestmark = pytest.mark.django_db


def test_flush_saves_the_text_of_every_streaming_reply_and_leaves_ended_ones_alone():
    conversation = create_conversation()
    first = create_message(conversation, role="assistant", content="", status="streaming")
    second = create_message(conversation, role="assistant", content="", status="streaming")
    ended = create_message(conversation, role="assistant", content="final", status="complete")

    saving.reply_flush(
        contents={
            first.id: ("Once upon", 2),
            second.id: ("A 'quoted' ünïcode", 3),
            ended.id: ("late text", 9),
        },
        alive=[first.id, second.id],
    )

    rows = {m.id: (m.content, m.next_seq) for m in Message.objects.all()}
    assert rows[first.id] == ("Once upon", 2)
    assert rows[second.id] == ("A 'quoted' ünïcode", 3)
    assert rows[ended.id] == ("final", 0)


def test_flush_marks_idle_relays_alive_so_they_are_not_taken_for_orphans():
    reply = create_message(create_conversation(), role="assistant", status="streaming")
    old = timezone.now() - datetime.timedelta(minutes=5)
    Message.objects.filter(pk=reply.pk).update(updated_at=old)

    saving.reply_flush(contents={}, alive=[reply.id])

    assert saving.replies_interrupt_orphans(stale_after=60, exclude=set()) == []


def test_a_reply_nobody_saves_becomes_interrupted_with_its_text_kept():
    reply = create_message(
        create_conversation(), role="assistant", content="half a sto", status="streaming"
    )
    Message.objects.filter(pk=reply.pk).update(
        updated_at=timezone.now() - datetime.timedelta(minutes=5)
    )

    orphans = saving.replies_interrupt_orphans(stale_after=60, exclude=set())

    reply.refresh_from_db()
    assert [o.id for o in orphans] == [reply.id]
    assert (reply.status, reply.content, reply.retryable) == ("interrupted", "half a sto", True)


def sent_with_relay_start(monkeypatch, conversation, content: str):
    """A send as the API makes it, and what it hands the relay's start."""
    launches = []
    monkeypatch.setattr(relay_manager, "launch", lambda *args: launches.append(args))
    sent = services.message_send(conversation=conversation, content=content)
    [(message_id, known, path)] = launches
    assert message_id == sent.assistant_message.id
    return known, path


@pytest.mark.django_db(transaction=True)
def test_a_sends_relay_starts_with_one_query_and_the_same_request(
    monkeypatch, django_assert_num_queries
):
    conversation = create_conversation(system_prompt="Be brief.")
    known, path = sent_with_relay_start(monkeypatch, conversation, "first")
    saving.reply_finish(
        message_id=known.id, fields={"status": "complete", "content": "one"}, usage=None
    )
    known, path = sent_with_relay_start(monkeypatch, conversation, "second")

    with django_assert_num_queries(1):
        message, request = saving.reply_load(message_id=known.id, known=known, path=path)

    _, read = saving.reply_load(message_id=known.id)
    assert message is known
    assert request == read
    assert [m["content"] for m in request.messages] == ["Be brief.", "first", "one", "second"]


@pytest.mark.django_db(transaction=True)
def test_a_reply_deleted_before_its_relay_starts_is_not_relayed(monkeypatch):
    conversation = create_conversation()
    known, path = sent_with_relay_start(monkeypatch, conversation, "hello")
    conversation.delete()

    with pytest.raises(Message.DoesNotExist):
        saving.reply_load(message_id=known.id, known=known, path=path)


# --- a reply's final save, the same on SQLite and PostgreSQL -----------------------------
# The counts are finish_scenarios.COUNTED: replies, failures, prompt and completion tokens,
# replies with a first token, of them within 100 ms.
ONE_REPLY = [1, 0, 10, 3, 1, 1]
EXPECTED = {
    "ended_here": {"days": [ONE_REPLY], "reply": ["complete", "a b c"]},
    "two_replies_one_row": {"days": [[2, 1, 20, 5, 2, 2]], "reply": ["failed", "a b c"]},
    "retried": {"days": [ONE_REPLY], "reply": ["complete", "a b c"]},
    # The sweeper counted it already (not done by this scenario: no row); its end is saved.
    "sweeper_first": {"days": [], "reply": ["complete", "a b c"]},
    "deleted": {"days": [ONE_REPLY], "reply": []},  # the tokens were used all the same
}


@pytest.mark.django_db(transaction=True)
def test_a_replys_final_save_counts_it_once_and_only_when_it_ended_it():
    observed = finish_scenarios.observe()
    assert {case: observed[case] for case in EXPECTED} == EXPECTED


@pytest.mark.scaled
def test_on_postgresql_the_final_save_is_one_statement_with_the_same_outcome(postgres_url):
    code = "import django; django.setup(); " + (
        "from tests.chat.relay import finish_scenarios as s; s.print_on_migrated_database()"
    )
    observed = json_from_child(code, postgres_url)
    assert {case: observed[case] for case in EXPECTED} == EXPECTED
    assert observed["statements"] == 1  # no BEGIN, second UPDATE or COMMIT
