import uuid

from django.conf import settings
from django.db import models

from chat.rates import decode_rate


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True)
    system_prompt = models.TextField(blank=True)
    model = models.CharField(max_length=200, blank=True, help_text="Blank: the server's default.")
    temperature = models.FloatField(null=True, blank=True)
    top_p = models.FloatField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"], name="conv_owner_recent")]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.id}"


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        STREAMING = "streaming"
        COMPLETE = "complete"
        CANCELLED = "cancelled"
        FAILED = "failed"
        INTERRUPTED = "interrupted"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    finish_reason = models.CharField(max_length=16, blank=True)
    reply_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="replies"
    )
    model = models.CharField(max_length=200, blank=True)
    # The seq the next token event of this reply will carry: the saved content holds
    # exactly the token events 0..next_seq-1, which lets the page resume without duplicates.
    next_seq = models.PositiveIntegerField(default=0)
    # Replaced by a regenerated reply or an edited question: hidden from the chat and the
    # prompt, kept for the transcript.
    superseded = models.BooleanField(default=False)
    # Set by Stop, for a relay that subscribes to its stop signal only after Stop was sent.
    stop_requested = models.BooleanField(default=False)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    retryable = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["conversation", "created_at"], name="msg_conv_order"),
            models.Index(fields=["status", "updated_at"], name="msg_status_age"),
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:60]}"

    @property
    def tokens_per_second(self) -> float | None:
        if self.duration_ms is None or self.ttft_ms is None:
            return None
        rate = decode_rate(self.completion_tokens, self.ttft_ms / 1000, self.duration_ms / 1000)
        return None if rate is None else round(rate, 1)


class UsageEvent(models.Model):
    """One reply started or conversation created, kept for a rate window. Counted here and
    not from messages, so deleting a conversation does not give its quota back."""

    class Action(models.TextChoices):
        REPLY = "reply"
        CONVERSATION = "conversation"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    action = models.CharField(max_length=16, choices=Action.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["user", "action", "created_at"], name="usage_user_recent")]
