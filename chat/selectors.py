"""Reads. Each returns only what the given user may see."""

import datetime
import uuid

from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from chat.models import Conversation, Message
from chat.permissions import can_review


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
    if not can_review(user):
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
    """Questions sent since then: user messages that asked for a reply. The earlier turns
    an API call brings along (stored with it, unanswered) are not sends."""
    answered = Message.objects.filter(reply_to=OuterRef("pk"))
    return Message.objects.filter(
        Exists(answered), conversation__owner=user, role=Message.Role.USER, created_at__gte=since
    ).count()


def prompt_history(*, reply: Message) -> list[Message]:
    """The visible messages a reply answers: everything up to and including its question."""
    question = reply.reply_to
    messages = reply.conversation.messages.filter(superseded=False).exclude(pk=reply.pk)
    if question is not None:
        messages = messages.filter(created_at__lte=question.created_at)
    return list(messages.order_by("created_at"))


# --- staff review and housekeeping ---------------------------------------------------


def conversation_transcript(*, conversation: Conversation) -> QuerySet[Message]:
    """Every message, replaced ones included: a review must see what was regenerated."""
    return conversation.messages.order_by("created_at", "id")


def conversations_with_summary(conversations: QuerySet[Conversation]) -> QuerySet[Conversation]:
    """The admin list's figures: message count, last activity, the latest reply's model and
    status (`streaming` while any reply is)."""
    replies = Message.objects.filter(
        conversation=OuterRef("pk"), role=Message.Role.ASSISTANT, superseded=False
    ).order_by("-created_at")
    streaming = Message.objects.filter(
        conversation=OuterRef("pk"), status=Message.Status.STREAMING
    )
    return conversations.annotate(
        message_count=Count("messages", distinct=True),
        # Replies are flushed without touching the conversation row, so its updated_at
        # alone would hide a long reply still being written.
        last_activity=Coalesce(Max("messages__updated_at"), "updated_at"),
        last_reply_model=Subquery(replies.values("model")[:1]),
        reply_status=Case(
            When(Exists(streaming), then=Value(Message.Status.STREAMING)),
            default=Subquery(replies.values("status")[:1]),
            output_field=CharField(),
        ),
    )


def reply_model_names() -> list[str]:
    """Every model that wrote a reply, for filtering (a conversation's own field is usually
    blank)."""
    return list(
        Message.objects.filter(role=Message.Role.ASSISTANT)
        .exclude(model="")
        .values_list("model", flat=True)
        .distinct()
        .order_by("model")
    )


def conversations_with_reply_model(
    conversations: QuerySet[Conversation], *, model: str
) -> QuerySet[Conversation]:
    replies = Message.objects.filter(conversation=OuterRef("pk"), model=model)
    return conversations.filter(Exists(replies))


def conversations_inactive_since(*, cutoff: datetime.datetime) -> QuerySet[Conversation]:
    # Replies are saved without touching the conversation row: a message updated after
    # the cutoff keeps it, and a reply still streaming always does.
    recent = Message.objects.filter(conversation=OuterRef("pk"), updated_at__gte=cutoff)
    streaming = Message.objects.filter(conversation=OuterRef("pk"), status=Message.Status.STREAMING)
    return (
        Conversation.objects.filter(updated_at__lt=cutoff)
        .exclude(Exists(recent))
        .exclude(Exists(streaming))
    )
