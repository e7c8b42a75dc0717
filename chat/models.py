import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from chat.rates import decode_rate


class SamplingFields(models.Model):
    """The sampling settings of chat/sampling.py; blank: the preset's, then the site's."""

    repetition_penalty = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.5), MaxValueValidator(2)]
    )
    frequency_penalty = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(-2), MaxValueValidator(2)]
    )
    presence_penalty = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(-2), MaxValueValidator(2)]
    )
    top_k = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(1000)])
    min_p = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(1)]
    )

    class Meta:
        abstract = True


class Preset(SamplingFields):
    """A prepared assistant staff offer when a chat starts: a system prompt and sampling
    settings. A conversation's own settings win over its preset's."""

    name = models.CharField(max_length=100, unique=True)
    description = models.CharField(max_length=300, blank=True)
    system_prompt = models.TextField(blank=True)
    temperature = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(2)]
    )
    top_p = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(1)]
    )
    max_tokens = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    is_active = models.BooleanField(
        default=True, help_text="Only active presets are offered for new chats."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Conversation(SamplingFields):
    class Source(models.TextChoices):
        PAGE = "page"
        API = "api"  # a call to the site's /v1/chat/completions with an API key

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: conv_owner_recent begins with it and serves its lookups, and a
    # second index would be one more B-tree written in every send (migration 0007)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="conversations",
        db_index=False,
    )
    title = models.CharField(max_length=200, blank=True)
    system_prompt = models.TextField(blank=True)
    preset = models.ForeignKey(
        Preset, null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations"
    )
    # The last message of the path the user sees; the path is its chain of parents.
    active_leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    model = models.CharField(max_length=200, blank=True, help_text="Blank: the server's default.")
    temperature = models.FloatField(null=True, blank=True)
    top_p = models.FloatField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.PAGE)
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
    conversation = models.ForeignKey(  # msg_conv_order indexes it (see Conversation.owner)
        Conversation, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    finish_reason = models.CharField(max_length=16, blank=True)
    # The message this one follows in the tree (null for a first message). Siblings share
    # a parent: an edited question beside the old one, a regenerated reply beside the old.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    # For a reply: the question it answers (its parent, kept for the API's `reply_to`).
    reply_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="replies"
    )
    model = models.CharField(max_length=200, blank=True)
    # The seq the next token event of this reply will carry: the saved content holds
    # exactly the token events 0..next_seq-1, which lets the page resume without duplicates.
    next_seq = models.PositiveIntegerField(default=0)
    # For a reply: the preset, system prompt and sampling it was asked with, copied when
    # it was created, so that editing a preset or the conversation later does not rewrite
    # the record (and the relay asks exactly what is recorded).
    generation = models.JSONField(default=dict, blank=True)
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
            # Replies being written, by conversation: each send's admission counts and the
            # sweeper's orphans. Not updated_at, which every flush of streamed text changes:
            # an index on it made each flush write a new entry in every index of the table
            # (no HOT update), and the entries of those dead versions piled up under
            # 'streaming' until a vacuum (bench/README.md, issue 18's eighteenth round).
            models.Index(fields=["status", "conversation"], name="msg_streaming"),
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

    user = models.ForeignKey(  # usage_user_recent indexes it (see Conversation.owner)
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    action = models.CharField(max_length=16, choices=Action.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["user", "action", "created_at"], name="usage_user_recent")]


class Feedback(models.Model):
    """A user's rating of one reply, with an optional comment; changeable, one per reply."""

    class Rating(models.TextChoices):
        UP = "up"
        DOWN = "down"

    message = models.OneToOneField(Message, on_delete=models.CASCADE, related_name="feedback")
    rating = models.CharField(max_length=8, choices=Rating.choices, blank=True)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "feedback"

    def __str__(self) -> str:
        return f"{self.rating or 'comment'} on {self.message_id}"


class ShareLink(models.Model):
    """A read-only link to a snapshot of a conversation's path: the messages up to `leaf`,
    as they were when shared. Revoked links stay (revoked_at set) so a token never comes
    back to life."""

    token = models.CharField(max_length=64, unique=True)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="share_links"
    )
    leaf = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="+")
    show_owner = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"share of {self.conversation_id}"


# Upper bounds (ms) of the time-to-first-token histogram kept per UsageDay row, one column
# each, plus one for slower replies: percentiles over a month are then sums of a few
# thousand rows, not a scan of every reply.
TTFT_BUCKETS_MS = (50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000, 20000, 60000)
TTFT_BUCKET_FIELDS = tuple(f"ttft_le_{bound}" for bound in TTFT_BUCKETS_MS) + ("ttft_slower",)


class UsageDay(models.Model):
    """What one user used of one model on one day (UTC), from the page or the API: one row
    upserted as each reply ends, in the transaction that saves the reply's final state."""

    user = models.ForeignKey(  # usage_day_unique indexes it (see Conversation.owner)
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="usage_days",
        db_index=False,
    )
    day = models.DateField()
    model = models.CharField(max_length=200, blank=True)
    source = models.CharField(max_length=8, choices=Conversation.Source.choices)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    replies = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)  # failed or interrupted
    cancellations = models.PositiveIntegerField(default=0)
    # Sums for means: TTFT over the replies that got a first token; decode speed as tokens
    # after the first over the time after the first (weighted by tokens, like the relay's).
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_ms_total = models.BigIntegerField(default=0)
    decode_tokens = models.BigIntegerField(default=0)
    decode_ms = models.BigIntegerField(default=0)
    ttft_le_50 = models.PositiveIntegerField(default=0)
    ttft_le_100 = models.PositiveIntegerField(default=0)
    ttft_le_200 = models.PositiveIntegerField(default=0)
    ttft_le_300 = models.PositiveIntegerField(default=0)
    ttft_le_500 = models.PositiveIntegerField(default=0)
    ttft_le_750 = models.PositiveIntegerField(default=0)
    ttft_le_1000 = models.PositiveIntegerField(default=0)
    ttft_le_1500 = models.PositiveIntegerField(default=0)
    ttft_le_2000 = models.PositiveIntegerField(default=0)
    ttft_le_3000 = models.PositiveIntegerField(default=0)
    ttft_le_5000 = models.PositiveIntegerField(default=0)
    ttft_le_10000 = models.PositiveIntegerField(default=0)
    ttft_le_20000 = models.PositiveIntegerField(default=0)
    ttft_le_60000 = models.PositiveIntegerField(default=0)
    ttft_slower = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "day", "model", "source"], name="usage_day_unique"
            )
        ]
        indexes = [models.Index(fields=["day"], name="usage_day_day")]

    def __str__(self) -> str:
        return f"{self.user_id} {self.day} {self.model or 'default'} ({self.source})"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TokenQuota(models.Model):
    """A per-user or per-group override of the site's token quotas (CHAT_DAILY_TOKEN_QUOTA,
    CHAT_MONTHLY_TOKEN_QUOTA). Blank inherits; 0 means no limit."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="token_quota",
    )
    group = models.OneToOneField(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="token_quota"
    )
    daily_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Tokens (prompt + completion) per UTC day. "
        "Blank: inherit (the user's groups, then the site). 0: no limit.",
    )
    monthly_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Tokens per calendar month (UTC). "
        "Blank: inherit (the user's groups, then the site). 0: no limit.",
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False),
                name="token_quota_user_xor_group",
            )
        ]

    def __str__(self) -> str:
        return f"Token quota of {self.user or self.group}"


class ApiKey(models.Model):
    """A personal key for the site's OpenAI-compatible /v1 API. Only a SHA-256 of the secret
    is kept: the secret itself is shown once, when the key is created."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The start of the key, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
