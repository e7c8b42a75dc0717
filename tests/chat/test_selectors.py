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


@pytest.mark.parametrize("with_preset", [False, True])
def test_the_locked_conversation_reads_what_the_orm_reads(with_preset, django_assert_num_queries):
    from chat.models import Conversation, Preset

    preset = Preset.objects.create(name="p", system_prompt="be brief", temperature=0.3)
    conversation = create_conversation(
        title="t", preset=preset if with_preset else None, temperature=0.7, max_tokens=9
    )
    create_message(conversation)  # not read: only the conversation's row

    with django_assert_num_queries(1):
        locked = selectors.conversation_locked(
            owner_id=conversation.owner_id, conversation_id=conversation.id
        )
        assert locked.preset == (preset if with_preset else None)  # no query of its own
    expected = Conversation.objects.select_related("preset").get(pk=conversation.pk)
    for field in Conversation._meta.concrete_fields:
        assert getattr(locked, field.attname) == getattr(expected, field.attname), field.name
    if with_preset:
        for field in Preset._meta.concrete_fields:
            assert getattr(locked.preset, field.attname) == getattr(preset, field.attname)
    assert not locked._state.adding

    with pytest.raises(Conversation.DoesNotExist):
        selectors.conversation_locked(
            owner_id=create_conversation().owner_id, conversation_id=conversation.id
        )


@pytest.mark.parametrize(
    "who, readable",
    [
        ("owner", True),
        ("stranger", False),
        ("staff without the permission", False),
        ("reviewer", True),
        ("anonymous", False),
    ],
)
def test_a_conversation_is_readable_by_its_owner_and_reviewers_only(
    make_user, reviewer, who, readable
):
    from django.contrib.auth.models import AnonymousUser

    conversation = create_conversation()
    user = {
        "owner": conversation.owner,
        "stranger": make_user("stranger"),
        "staff without the permission": make_user("plainstaff", staff=True),
        "reviewer": reviewer,
        "anonymous": AnonymousUser(),
    }[who]
    assert (
        selectors.conversation_readable_by(user=user, conversation_id=conversation.id) is readable
    )


def test_an_owners_check_is_one_query_and_a_deleted_conversation_is_not_readable(
    django_assert_num_queries,
):
    conversation = create_conversation()
    owner, conversation_id = conversation.owner, conversation.id
    with django_assert_num_queries(1):
        assert selectors.conversation_readable_by(user=owner, conversation_id=conversation_id)
    with django_assert_num_queries(1):  # the id as the URL gives it, a string
        assert selectors.conversation_readable_by(user=owner, conversation_id=str(conversation_id))
    conversation.delete()
    assert not selectors.conversation_readable_by(user=owner, conversation_id=conversation_id)
