"""Small factories for test data."""

import itertools
import uuid

from django.contrib.auth import get_user_model

from chat.models import Conversation, Message

_count = itertools.count()


def unique_name(prefix: str = "user") -> str:
    """A name no other test (or earlier run against the same live site) has used."""
    return f"{prefix}{next(_count)}{uuid.uuid4().hex[:6]}"


def create_user(username: str | None = None, **fields):
    username = username or f"user{next(_count)}"
    return get_user_model().objects.create_user(
        username=username, password="pw-Long-enough-1", **fields
    )


def create_conversation(owner=None, **fields) -> Conversation:
    return Conversation.objects.create(owner=owner or create_user(), **fields)


def create_message(conversation=None, role="user", content="hello", **fields) -> Message:
    """A message at the end of the conversation's active path, as the services add one:
    under `parent` if given, else under its `reply_to`, else under the active leaf; it
    becomes the active leaf."""
    conversation = conversation or create_conversation()
    if "parent" not in fields and "parent_id" not in fields:
        fields["parent"] = fields.get("reply_to") or conversation.active_leaf
    message = Message.objects.create(
        conversation=conversation, role=role, content=content, **fields
    )
    conversation.active_leaf = message
    Conversation.objects.filter(pk=conversation.pk).update(active_leaf=message)
    return message
