"""Writes. Every function takes keyword-only, typed arguments, keeps its rows consistent in
one transaction, and owns its effects: a new reply's relay starts once the reply is
committed, so the relay always finds its row. Errors say what went wrong in a sentence for
the user; the API layer alone decides which HTTP status each kind gets."""

import datetime
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from chat import selectors, usage
from chat.models import Conversation, Message
from chat.relay.manager import relay_manager

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


class QuotaExceeded(RateLimited):
    """A daily or monthly token quota is used up until `resets_at`."""

    def __init__(self, message: str, resets_at: datetime.datetime):
        super().__init__(message)
        self.resets_at = resets_at


@dataclass(frozen=True)
class SentMessage:
    user_message: Message
    assistant_message: Message


def conversation_create(
    *, owner, title: str = "", system_prompt: str = "", settings_: dict | None = None
) -> Conversation:
    return Conversation.objects.create(
        owner=owner, title=title, system_prompt=system_prompt, **(settings_ or {})
    )


def conversation_update(*, conversation: Conversation, fields: dict) -> Conversation:
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


def _lock_owner(*, conversation: Conversation) -> None:
    """Serialize the sends of one user (PostgreSQL; SQLite serializes every write anyway),
    so the per-user checks that follow see every earlier send of this user committed.
    Always taken after the conversation's lock, so the two are never taken in the other
    order (no deadlock between an edit and a send)."""
    get_user_model().objects.select_for_update().only("pk").get(pk=conversation.owner_id)


def _check_quota(*, user) -> None:
    exceeded = usage.quota_exceeded(user=user)
    if exceeded is not None:
        raise QuotaExceeded(usage.quota_sentence(exceeded), exceeded.resets_at)


def _reply_create(*, conversation: Conversation, question: Message) -> Message:
    reply = Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
        reply_to=question,
        model=conversation.model or settings.INFERENCE_MODEL,
    )
    transaction.on_commit(lambda: relay_manager.launch(reply.id))
    return reply


def message_send(*, conversation: Conversation, content: str) -> SentMessage:
    with transaction.atomic():
        # Lock the conversation so two sends cannot both pass the streaming check.
        conversation = Conversation.objects.select_for_update().get(pk=conversation.pk)
        _lock_owner(conversation=conversation)
        _check_can_start_reply(conversation=conversation)
        _check_message_rate(user=conversation.owner)
        _check_quota(user=conversation.owner)
        question = Message.objects.create(
            conversation=conversation, role=Message.Role.USER, content=content
        )
        reply = _reply_create(conversation=conversation, question=question)
        if not conversation.title:
            conversation.title = title_from(content)
        conversation.save(update_fields=["title", "updated_at"])
    return SentMessage(user_message=question, assistant_message=reply)


def reply_regenerate(*, reply: Message) -> Message:
    if reply.role != Message.Role.ASSISTANT or reply.reply_to_id is None:
        raise ServiceError("Only a reply of the assistant can be regenerated.")
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().get(pk=reply.conversation_id)
        _lock_owner(conversation=conversation)
        _check_can_start_reply(conversation=conversation)
        _check_quota(user=conversation.owner)
        reply.conversation.messages.filter(
            reply_to_id=reply.reply_to_id, role=Message.Role.ASSISTANT
        ).update(superseded=True)
        new_reply = _reply_create(conversation=conversation, question=reply.reply_to)
        conversation.save(update_fields=["updated_at"])
    return new_reply


def message_edit(*, message: Message, content: str) -> SentMessage:
    """Replace the last question and its replies with a new question, and answer it."""
    if message.role != Message.Role.USER:
        raise ServiceError("Only your own messages can be edited.")
    conversation = message.conversation
    with transaction.atomic():
        Conversation.objects.select_for_update().get(pk=conversation.pk)
        later = selectors.conversation_messages(conversation=conversation).filter(
            role=Message.Role.USER, created_at__gt=message.created_at
        )
        if later.exists():
            raise ServiceError("Only the last message can be edited.")
        _check_can_start_reply(conversation=conversation)
        conversation.messages.filter(pk=message.pk).update(superseded=True)
        conversation.messages.filter(reply_to=message).update(superseded=True)
        return message_send(conversation=conversation, content=content)


def reply_stop(*, reply: Message) -> None:
    """Stop a reply being written; a reply that already ended is left as it is."""
    stopping = Message.objects.filter(pk=reply.pk, status=Message.Status.STREAMING).update(
        stop_requested=True
    )
    if stopping:
        relay_manager.request_stop(reply.pk)


def conversation_start_from_api(
    *, owner, system_prompt: str, turns: list[tuple[str, str]], settings_: dict
) -> SentMessage:
    """One call to the site's /v1/chat/completions: its messages become a new conversation
    (source `api`), the last one the question, and the reply starts as from the page, under
    the same per-user limits and quotas. `turns` are (role, content), oldest first."""
    question_text = turns[-1][1]
    with transaction.atomic():
        conversation = Conversation.objects.create(
            owner=owner, source=Conversation.Source.API, title=title_from(question_text),
            system_prompt=system_prompt, **settings_,
        )
        _lock_owner(conversation=conversation)
        _check_can_start_reply(conversation=conversation)
        _check_message_rate(user=owner)
        _check_quota(user=owner)
        history = _history_create(conversation=conversation, turns=turns)
        reply = _reply_create(conversation=conversation, question=history[-1])
    return SentMessage(user_message=history[-1], assistant_message=reply)


def _history_create(*, conversation: Conversation, turns: list[tuple[str, str]]) -> list[Message]:
    """The caller's messages in order. They are created together, so each gets its own
    microsecond: the prompt is rebuilt by created_at, and equal times would shuffle it."""
    messages = Message.objects.bulk_create(
        Message(conversation=conversation, role=role, content=content) for role, content in turns
    )
    first = timezone.now() - datetime.timedelta(microseconds=len(messages) + 1)
    for index, message in enumerate(messages):
        message.created_at = first + datetime.timedelta(microseconds=index)
    Message.objects.bulk_update(messages, ["created_at"])
    return messages
