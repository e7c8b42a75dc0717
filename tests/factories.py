"""Small factories for test data."""

import itertools

from django.contrib.auth import get_user_model

from chat.models import Conversation, Message

_count = itertools.count()


def make_user(username: str | None = None, **fields):
    username = username or f"user{next(_count)}"
    return get_user_model().objects.create_user(username=username, password="pw-Long-enough-1", **fields)


def make_conversation(owner=None, **fields) -> Conversation:
    return Conversation.objects.create(owner=owner or make_user(), **fields)


def make_message(conversation=None, role="user", content="hello", **fields) -> Message:
    return Message.objects.create(
        conversation=conversation or make_conversation(), role=role, content=content, **fields
    )
