"""The relay's writes: streamed text saved in batches, the final state, and replies left
`streaming` by a site process that died."""

import datetime
import uuid

from django.db import transaction
from django.utils import timezone

from chat.inference_client import ChatRequest
from chat.models import Message
from chat.relay import prompt


def reply_load(*, message_id: uuid.UUID) -> tuple[Message, ChatRequest]:
    """The reply still streaming and the request that writes it; Message.DoesNotExist
    when it ended before its relay started."""
    message = Message.objects.select_related("conversation", "reply_to").get(
        pk=message_id, status=Message.Status.STREAMING
    )
    return message, prompt.build_request(message)


def reply_flush(*, contents: dict[uuid.UUID, tuple[str, int]], alive: list[uuid.UUID]) -> None:
    """Save streamed text of many replies in one transaction, and mark their relays alive."""
    now = timezone.now()
    with transaction.atomic():
        for message_id, (content, next_seq) in contents.items():
            Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(
                content=content, next_seq=next_seq, updated_at=now
            )
        idle = [message_id for message_id in alive if message_id not in contents]
        if idle:
            Message.objects.filter(pk__in=idle, status=Message.Status.STREAMING).update(
                updated_at=now
            )


def reply_finish(*, message_id: uuid.UUID, fields: dict) -> None:
    Message.objects.filter(pk=message_id).update(updated_at=timezone.now(), **fields)


def replies_interrupt_orphans(*, stale_after: float, exclude: set) -> list[Message]:
    """Replies left `streaming` by a site process that died: their relay stopped writing."""
    cutoff = timezone.now() - datetime.timedelta(seconds=stale_after)
    with transaction.atomic():
        orphans = list(
            Message.objects.select_for_update()
            .filter(status=Message.Status.STREAMING, updated_at__lt=cutoff)
            .exclude(pk__in=exclude)
        )
        for message in orphans:
            message.status = Message.Status.INTERRUPTED
            message.error = "The site restarted while this reply was being written."
            message.retryable = True
            message.save(update_fields=["status", "error", "retryable", "updated_at"])
    return orphans
