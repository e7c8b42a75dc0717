"""One reply while it streams, and the saved fields and final event it ends with."""

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from chat.inference_client import Finish, InferenceError
from chat.models import Message
from chat.rates import decode_rate
from chat.streaming.channels import channel_for
from chat.streaming.publish import message_error_data, token_data, token_data_prefix
from chat.usage import ReplyUsage

CANCELLED = "cancelled"


@dataclass
class Reply:
    message_id: uuid.UUID
    conversation_id: uuid.UUID
    model: str
    # Whose usage the reply adds to, and the prompt's estimated tokens, used when the
    # server reports no usage (another engine, or a reply stopped or failed mid-way).
    owner_id: int | None = None
    source: str = "page"
    prompt_estimate: int = 0
    started: float = field(default_factory=time.monotonic)
    # Text published so far; joined only when saved, not once per token.
    parts: list[str] = field(default_factory=list)
    # Text received but not yet published: tokens that arrive together go out as one event.
    buffer: list[str] = field(default_factory=list)
    produced_at: float | None = None
    seq: int = 0
    ttft: float | None = None
    deltas: int = 0
    progress_at: float = float("-inf")  # when the last `message.progress` event went out
    finish: Finish | None = None
    done: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Made once per reply rather than per token: the start of each token event's data, the
    # conversation's event channel, and whether token events carry the server's clock
    # (RELAY_EVENT_TIMESTAMPS).
    data_prefix: str = ""
    channel: str = ""
    timestamps: bool = False
    # Tokens are published by a callback at the end of the loop turn in which they arrived
    # (see RelayManager._wake). local: one process, published there and then; else with
    # Redis, where `unconfirmed` events are on their way to the log: `seq` and `parts`
    # count only those in it.
    local: bool = False
    publish_pending: bool = False
    publish_error: BaseException | None = None
    unconfirmed: int = 0

    def __post_init__(self) -> None:
        self.data_prefix = token_data_prefix(self.message_id)
        self.channel = channel_for(self.conversation_id)

    def token_event(self, text: str) -> str:
        """The data of the next `token` event, carrying `text`."""
        stamp = self.produced_at if self.timestamps else None
        return token_data(self.data_prefix, self.seq + self.unconfirmed, text, stamp)

    @property
    def content(self) -> str:
        # Kept joined: every flush (twice a second) reads each streaming reply's text, and
        # joining all its tokens again each time grew with the reply's length.
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""


def final_state(reply: Reply, outcome) -> tuple[dict, str, dict]:
    """outcome: CANCELLED, None (the stream ended) or the InferenceError that ended it.
    Returns the fields to save, and the event type and data to publish."""
    duration = time.monotonic() - reply.started
    usage = reply.finish.usage if reply.finish else {}
    completion_tokens = usage.get("completion_tokens") or reply.deltas
    # Without the server's count, the prompt counts once the model began answering it.
    prompt_tokens = usage.get("prompt_tokens")
    if prompt_tokens is None and reply.ttft is not None:
        prompt_tokens = reply.prompt_estimate
    fields = {
        "content": reply.content,
        "next_seq": reply.seq,
        "ttft_ms": None if reply.ttft is None else round(reply.ttft * 1000),
        "duration_ms": round(duration * 1000),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "model": reply.model,
    }
    if isinstance(outcome, InferenceError):
        fields.update(
            status=Message.Status.FAILED, error=outcome.message, retryable=outcome.retryable
        )
        data = message_error_data(reply.message_id, outcome.message, outcome.retryable)
        return fields, "message.error", data
    if outcome == CANCELLED:
        fields.update(status=Message.Status.CANCELLED, finish_reason="cancelled")
    else:
        reason = reply.finish.reason if reply.finish else "stop"
        fields.update(status=Message.Status.COMPLETE, finish_reason=reason)
    rate = decode_rate(completion_tokens, reply.ttft, duration)
    return (
        fields,
        "message.end",
        {
            "message_id": str(reply.message_id),
            "finish_reason": fields["finish_reason"],
            "usage": {
                "prompt_tokens": fields["prompt_tokens"],
                "completion_tokens": completion_tokens,
            },
            "ttft_ms": fields["ttft_ms"],
            "tokens_per_second": None if rate is None else round(rate, 1),
            "model": reply.model,
        },
    )


def reply_usage(reply: Reply, fields: dict) -> ReplyUsage | None:
    """What the ended reply adds to its owner's usage (chat/usage.py)."""
    if reply.owner_id is None:
        return None
    return ReplyUsage(
        user_id=reply.owner_id,
        source=reply.source,
        model=fields["model"] or "",
        status=fields["status"],
        prompt_tokens=fields["prompt_tokens"] or 0,
        completion_tokens=fields["completion_tokens"] or 0,
        ttft_ms=fields["ttft_ms"],
        duration_ms=fields["duration_ms"],
    )
