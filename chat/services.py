"""Writes. Every function takes keyword-only, typed arguments, keeps its rows consistent in
one transaction, and owns its effects: a new reply's relay starts once the reply is
committed, so the relay always finds its row. Errors say what went wrong in a sentence for
the user; the API layer alone decides which HTTP status each kind gets."""

import datetime
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chat import selectors
from chat.models import Conversation, Feedback, Message, Preset
from chat.relay.manager import relay_manager
from chat.relay.prompt import generation_for

TITLE_CHARS = 60


class ServiceError(Exception):
    """The request cannot be done as asked (a rule of the conversation, not a fault)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Conflict(ServiceError):
    """The conversation's state forbids it now (a reply is still being written)."""


class RateLimited(ServiceError):
    """A per-user limit was reached; waiting makes it possible again."""


@dataclass(frozen=True)
class SentMessage:
    user_message: Message
    assistant_message: Message


def conversation_create(
    *,
    owner,
    title: str = "",
    system_prompt: str = "",
    preset: Preset | None = None,
    settings_: dict | None = None,
) -> Conversation:
    return Conversation.objects.create(
        owner=owner, title=title, system_prompt=system_prompt, preset=preset, **(settings_ or {})
    )


def conversation_update(*, conversation: Conversation, fields: dict) -> Conversation:
    """fields: the model's own (a preset as a Preset or None)."""
    for name, value in fields.items():
        setattr(conversation, name, value)
    conversation.save(update_fields=[*fields, "updated_at"])
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    conversation.delete()


def title_from(content: str) -> str:
    text = " ".join(content.split())
    if len(text) <= TITLE_CHARS:
        return text or "New chat"
    cut = text[:TITLE_CHARS].rsplit(" ", 1)[0] or text[:TITLE_CHARS]
    return cut + "…"


def _check_can_start_reply(*, conversation: Conversation) -> None:
    user = conversation.owner
    if selectors.conversation_is_streaming(conversation=conversation):
        raise Conflict("A reply is still being written in this conversation. Stop it or wait.")
    if selectors.user_streaming_count(user=user) >= settings.CHAT_MAX_STREAMING_PER_USER:
        raise RateLimited(
            "You have too many replies being written at once. Wait for one to finish."
        )


def _check_message_rate(*, user) -> None:
    since = timezone.now() - datetime.timedelta(minutes=1)
    if selectors.user_messages_since(user=user, since=since) >= settings.CHAT_MESSAGES_PER_MINUTE:
        raise RateLimited("You are sending messages too fast. Wait a minute and try again.")


def _locked(conversation_id) -> Conversation:
    # Lock the conversation so two requests cannot both pass the streaming check, nor
    # both move the active leaf.
    # of=("self",): PostgreSQL cannot lock the nullable side of the preset's outer join.
    return (
        Conversation.objects.select_for_update(of=("self",))
        .select_related("preset")
        .get(pk=conversation_id)
    )


def _reply_create(*, conversation: Conversation, question: Message) -> Message:
    reply = Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
        parent=question,
        reply_to=question,
        model=conversation.model or settings.INFERENCE_MODEL,
        generation=generation_for(conversation),
    )
    transaction.on_commit(lambda: relay_manager.launch(reply.id))
    return reply


def _question_and_reply(*, conversation: Conversation, parent_id, content: str) -> SentMessage:
    """A question under parent_id (None: a first message) and its streaming reply, which
    becomes the end of the active path."""
    question = Message.objects.create(
        conversation=conversation, role=Message.Role.USER, content=content, parent_id=parent_id
    )
    reply = _reply_create(conversation=conversation, question=question)
    conversation.active_leaf = reply
    if not conversation.title:
        conversation.title = title_from(content)
    conversation.save(update_fields=["title", "active_leaf", "updated_at"])
    return SentMessage(user_message=question, assistant_message=reply)


def message_send(*, conversation: Conversation, content: str) -> SentMessage:
    """A new question at the end of the active path, and its reply."""
    with transaction.atomic():
        conversation = _locked(conversation.pk)
        _check_can_start_reply(conversation=conversation)
        _check_message_rate(user=conversation.owner)
        path = selectors.conversation_tree(conversation=conversation).active_path(
            conversation.active_leaf_id
        )
        parent_id = path[-1] if path else None
        return _question_and_reply(conversation=conversation, parent_id=parent_id, content=content)


def reply_regenerate(*, reply: Message) -> Message:
    """Another reply to the same question, beside the old one; the old one stays a sibling."""
    if reply.role != Message.Role.ASSISTANT or reply.parent_id is None:
        raise ServiceError("Only a reply of the assistant can be regenerated.")
    with transaction.atomic():
        conversation = _locked(reply.conversation_id)
        _check_can_start_reply(conversation=conversation)
        new_reply = _reply_create(conversation=conversation, question=reply.parent)
        conversation.active_leaf = new_reply
        conversation.save(update_fields=["active_leaf", "updated_at"])
    return new_reply


def message_edit(*, message: Message, content: str) -> SentMessage:
    """A new version of any question of the user, beside the old one (same parent), and its
    reply. The old question and everything after it stay, one sibling away."""
    if message.role != Message.Role.USER:
        raise ServiceError("Only your own messages can be edited.")
    with transaction.atomic():
        conversation = _locked(message.conversation_id)
        _check_can_start_reply(conversation=conversation)
        _check_message_rate(user=conversation.owner)
        return _question_and_reply(
            conversation=conversation, parent_id=message.parent_id, content=content
        )


def conversation_switch(*, conversation: Conversation, message: Message) -> Conversation:
    """Make the active path run through this message, down to the newest message under it.
    Allowed while a reply streams: that reply goes on, on its own branch."""
    with transaction.atomic():
        conversation = _locked(conversation.pk)
        tree = selectors.conversation_tree(conversation=conversation)
        conversation.active_leaf_id = tree.newest_leaf_under(message.pk)
        conversation.save(update_fields=["active_leaf"])
    return conversation


def reply_stop(*, reply: Message) -> None:
    """Stop a reply being written; a reply that already ended is left as it is."""
    stopping = Message.objects.filter(pk=reply.pk, status=Message.Status.STREAMING).update(
        stop_requested=True
    )
    if stopping:
        relay_manager.request_stop(reply.pk)


def feedback_set(*, reply: Message, rating: str | None, comment: str) -> Feedback | None:
    """Set or change the user's rating and comment on a reply; both empty removes it."""
    if reply.role != Message.Role.ASSISTANT:
        raise ServiceError("Only a reply of the assistant can be rated.")
    if reply.status == Message.Status.STREAMING:
        raise Conflict("This reply is still being written. Rate it once it has finished.")
    if not rating and not comment.strip():
        Feedback.objects.filter(message=reply).delete()
        return None
    feedback, _ = Feedback.objects.update_or_create(
        message=reply, defaults={"rating": rating or "", "comment": comment}
    )
    return feedback
