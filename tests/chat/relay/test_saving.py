"""The relay's writes: batched saves of streamed text, and orphaned replies."""

import datetime

import pytest
from django.utils import timezone

from chat.models import Message
from chat.relay import saving
from tests.support.factories import create_conversation, create_message

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
