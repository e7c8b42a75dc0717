"""A reply's final save (chat.relay.saving.reply_finish) in each case the relay meets, and
what it left in the database: run in the test process on SQLite and, through
`print_on_migrated_database` in a process of its own with DATABASE_URL set, on
PostgreSQL, where the save is one statement of its own (test_saving.py compares them)."""

import json

from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.models import Message, UsageDay
from chat.relay import saving
from chat.usage import ReplyUsage
from tests.support.factories import create_conversation, create_message

COUNTED = ["replies", "failures", "prompt_tokens", "completion_tokens", "ttft_count", "ttft_le_100"]


def observe() -> dict:
    """Each case's day rows (the counts above) and the reply's saved status."""
    return {
        "ended_here": _ended_here(),
        "two_replies_one_row": _two_replies(),
        "retried": _retried(),
        "sweeper_first": _sweeper_first(),
        "deleted": _deleted(),
        "statements": _statements(),
    }


def _streaming_reply() -> Message:
    conversation = create_conversation()
    question = create_message(conversation, content="hello")
    return create_message(
        conversation, role="assistant", content="", status="streaming", reply_to=question
    )


def _finish(reply_id, user_id, *, status="complete", tokens=3) -> None:
    usage = ReplyUsage(
        user_id=user_id,
        source="page",
        model="m",
        status=status,
        prompt_tokens=10,
        completion_tokens=tokens,
        ttft_ms=80,
        duration_ms=400,
    )
    fields = {"status": status, "content": "a b c", "completion_tokens": tokens}
    saving.reply_finish(message_id=reply_id, fields=fields, usage=usage)


def _state(reply_id, user_id) -> dict:
    days = UsageDay.objects.filter(user_id=user_id).values(*COUNTED)
    status = Message.objects.filter(pk=reply_id).values_list("status", "content").first()
    return {"days": [list(day.values()) for day in days], "reply": list(status or [])}


def _ended_here() -> dict:
    reply = _streaming_reply()
    user_id = reply.conversation.owner_id
    _finish(reply.pk, user_id)
    return _state(reply.pk, user_id)


def _two_replies() -> dict:
    first = _streaming_reply()
    user_id = first.conversation.owner_id
    second = create_message(
        first.conversation, role="assistant", content="", status="streaming", reply_to=first
    )
    _finish(first.pk, user_id)
    _finish(second.pk, user_id, status="failed", tokens=2)
    return _state(second.pk, user_id)


def _retried() -> dict:
    reply = _streaming_reply()
    user_id = reply.conversation.owner_id
    _finish(reply.pk, user_id)
    _finish(reply.pk, user_id)
    return _state(reply.pk, user_id)


def _sweeper_first() -> dict:
    reply = _streaming_reply()
    user_id = reply.conversation.owner_id
    Message.objects.filter(pk=reply.pk).update(status="interrupted", content="a")
    _finish(reply.pk, user_id)
    return _state(reply.pk, user_id)


def _deleted() -> dict:
    reply = _streaming_reply()
    user_id = reply.conversation.owner_id
    reply.conversation.delete()
    _finish(reply.pk, user_id)
    return _state(reply.pk, user_id)


def _statements() -> int:
    reply = _streaming_reply()
    with CaptureQueriesContext(connection) as queries:
        _finish(reply.pk, reply.conversation.owner_id)
    return len(queries.captured_queries)


def print_on_migrated_database() -> None:
    """In a child process (Django set up, DATABASE_URL a new database): observe() as JSON."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print(json.dumps(observe()))
