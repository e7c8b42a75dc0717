"""Reads. Each returns only what the given user may see."""

import uuid

from django.db.models import Exists, OuterRef, Q, QuerySet

from chat.models import Conversation, Message


def conversation_list(*, user, query: str = "") -> QuerySet[Conversation]:
    conversations = Conversation.objects.filter(owner=user)
    if query:
        matching_messages = Message.objects.filter(
            conversation=OuterRef("pk"), content__icontains=query, superseded=False
        )
        conversations = conversations.filter(
            Q(title__icontains=query) | Exists(matching_messages)
        )
    return conversations.order_by("-updated_at")


def conversation_get(*, user, conversation_id: uuid.UUID) -> Conversation:
    """The user's own conversation; raises Conversation.DoesNotExist for anyone else's."""
    return Conversation.objects.get(pk=conversation_id, owner=user)


def conversation_readable_by(*, user, conversation_id: uuid.UUID) -> bool:
    if not user.is_authenticated:
        return False
    conversations = Conversation.objects.filter(pk=conversation_id)
    if not (user.is_staff and user.has_perm("chat.view_conversation")):
        conversations = conversations.filter(owner=user)
    return conversations.exists()


def conversation_messages(*, conversation: Conversation) -> QuerySet[Message]:
    return conversation.messages.filter(superseded=False).order_by("created_at")


def conversation_is_streaming(*, conversation: Conversation) -> bool:
    return conversation.messages.filter(status=Message.Status.STREAMING).exists()


def message_get(*, user, message_id: uuid.UUID) -> Message:
    return Message.objects.select_related("conversation").get(
        pk=message_id, conversation__owner=user
    )


def user_streaming_count(*, user) -> int:
    return Message.objects.filter(
        conversation__owner=user, status=Message.Status.STREAMING
    ).count()


def user_messages_since(*, user, since) -> int:
    return Message.objects.filter(
        conversation__owner=user, role=Message.Role.USER, created_at__gte=since
    ).count()


def prompt_history(*, reply: Message) -> list[Message]:
    """The visible messages a reply answers: everything up to and including its question."""
    question = reply.reply_to
    messages = reply.conversation.messages.filter(superseded=False).exclude(pk=reply.pk)
    if question is not None:
        messages = messages.filter(created_at__lte=question.created_at)
    return list(messages.order_by("created_at"))
