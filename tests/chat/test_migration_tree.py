"""Migration 0003 turns the old rows (reply_to, superseded) into a tree without losing a
message, and going back hides what is off the active path again."""

import datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("chat", "0002_stop_requested")]
AFTER = [("chat", "0004_conversation_tree")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def old_conversation(apps):
    """q1 a1(hidden) a1' ; q2(hidden, edited) a2(hidden) ; q2' a2'(hidden) a2'' — as the old
    regenerate and edit left them."""
    User = apps.get_model("auth", "User")
    Conversation = apps.get_model("chat", "Conversation")
    Message = apps.get_model("chat", "Message")
    owner = User.objects.create(username="old-timer")
    conversation = Conversation.objects.create(owner=owner, title="Before trees")
    start = timezone.now() - datetime.timedelta(hours=1)
    made = {}

    def add(name, role, hidden=False, reply_to=None):
        message = Message.objects.create(
            conversation=conversation,
            role=role,
            content=name,
            superseded=hidden,
            reply_to=made.get(reply_to),
        )
        Message.objects.filter(pk=message.pk).update(
            created_at=start + datetime.timedelta(seconds=len(made))
        )
        made[name] = message

    add("q1", "user")
    add("a1", "assistant", True, "q1")
    add("a1'", "assistant", False, "q1")
    add("q2", "user", True)
    add("a2", "assistant", True, "q2")
    add("q2'", "user")
    add("a2'", "assistant", True, "q2'")
    add("a2''", "assistant", False, "q2'")
    return conversation.pk, {name: m.pk for name, m in made.items()}


def test_old_rows_become_a_tree_and_back():
    apps = migrate(BEFORE)
    conversation_id, ids = old_conversation(apps)
    apps = migrate(AFTER)
    Message = apps.get_model("chat", "Message")
    Conversation = apps.get_model("chat", "Conversation")
    name = {v: k for k, v in ids.items()}
    parents = {name[m.pk]: name.get(m.parent_id) for m in Message.objects.all()}
    assert parents == {
        "q1": None,
        "a1": "q1",
        "a1'": "q1",
        "q2": "a1'",
        "a2": "q2",
        "q2'": "a1'",
        "a2'": "q2'",
        "a2''": "q2'",
    }
    assert name[Conversation.objects.get(pk=conversation_id).active_leaf_id] == "a2''"

    apps = migrate(BEFORE)
    Message = apps.get_model("chat", "Message")
    hidden = {name[m.pk] for m in Message.objects.filter(superseded=True)}
    assert hidden == {"a1", "q2", "a2", "a2'"}
    migrate(latest())  # every later migration too, for the tests that run after this one


def latest():
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()
