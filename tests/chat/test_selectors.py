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
