"""Reads (chat/selectors.py) whose SQL is written by hand: they must read what the ORM
would."""

import pytest

from chat import selectors
from chat.tree import Node
from tests.support.factories import create_conversation, create_message

pytestmark = pytest.mark.django_db


def test_the_conversation_tree_reads_what_the_orm_reads():
    conversation = create_conversation()
    first = create_message(conversation, content="first")
    reply = create_message(conversation, role="assistant", parent=first)
    create_message(conversation, content="edited", parent=None)
    create_message(conversation, content="next", parent=reply)
    create_message(create_conversation(), content="another conversation's")

    tree = selectors.conversation_tree(conversation=conversation)

    rows = conversation.messages.values_list("id", "parent_id", "created_at")
    assert tree.nodes == {row[0]: Node(*row) for row in rows}
    assert all(
        type(got) is type(want)
        for node in tree.nodes.values()
        for got, want in zip((node.id, node.created_at), (first.id, first.created_at), strict=True)
    )


def test_a_replys_history_reads_its_own_path_newest_first():
    conversation = create_conversation()
    first = create_message(conversation, content="first")
    answer = create_message(conversation, role="assistant", content="answer", parent=first)
    create_message(conversation, content="a branch", parent=first)
    question = create_message(conversation, content="second", parent=answer)
    reply = create_message(conversation, role="assistant", content="", parent=question)
    reply.status = reply.Status.STREAMING
    reply.save()
    path = [first.id, answer.id, question.id]

    for known in (None, path):
        history = list(selectors.prompt_history_newest_first(reply=reply, path=known))
        assert history == [("user", "second"), ("assistant", "answer"), ("user", "first")]
    reply.stop_requested = False
    type(reply).objects.filter(pk=reply.pk).update(stop_requested=True)
    list(selectors.prompt_history_newest_first(reply=reply, path=path))
    assert reply.stop_requested is True  # read with the path's first page
