"""The JSON shapes of the site API."""

from chat.models import ApiKey, Conversation, Message
from chat.streaming.channels import events_url


def message_json(message: Message) -> dict:
    return {
        "id": str(message.id),
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "finish_reason": message.finish_reason or None,
        "reply_to": str(message.reply_to_id) if message.reply_to_id else None,
        "model": message.model or None,
        "next_seq": message.next_seq,
        "prompt_tokens": message.prompt_tokens,
        "completion_tokens": message.completion_tokens,
        "ttft_ms": message.ttft_ms,
        "duration_ms": message.duration_ms,
        "tokens_per_second": message.tokens_per_second,
        "error": message.error or None,
        "retryable": message.retryable,
        "created_at": message.created_at.isoformat(),
    }


def conversation_json(conversation: Conversation, messages=None) -> dict:
    data = {
        "id": str(conversation.id),
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "model": conversation.model,
        "temperature": conversation.temperature,
        "top_p": conversation.top_p,
        "max_tokens": conversation.max_tokens,
        "source": conversation.source,
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
        "events_url": events_url(conversation.id),
    }
    if messages is not None:
        data["messages"] = [message_json(message) for message in messages]
    return data


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def usage_json(usage: dict, quotas) -> dict:
    """GET /api/usage/: tokens and replies today and this month, and the quotas."""
    return {
        "today": usage["today"],
        "month": usage["month"],
        "quota": {
            state.limit.period: {
                "limit": state.limit.tokens,
                "used": state.used,
                "remaining": state.remaining,
                "set_by": state.limit.set_by,
                "resets_at": _iso(state.resets_at),
            }
            for state in quotas
        },
    }


def api_key_json(key: ApiKey, secret: str | None = None) -> dict:
    data = {
        "id": str(key.id),
        "name": key.name,
        "prefix": key.prefix,
        "created_at": _iso(key.created_at),
        "last_used_at": _iso(key.last_used_at),
    }
    if secret is not None:
        data["key"] = secret  # only in the answer that creates it
    return data
