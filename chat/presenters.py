"""The JSON shapes of the site API."""

from django.urls import reverse

from chat import sampling
from chat.models import ApiKey, Conversation, Feedback, Message, Preset, ShareLink
from chat.streaming.channels import events_url


def feedback_json(feedback: Feedback | None) -> dict | None:
    if feedback is None:
        return None
    return {
        "rating": feedback.rating or None,
        "comment": feedback.comment,
        "updated_at": feedback.updated_at.isoformat(),
    }


def message_json(message: Message, siblings: list | None = None) -> dict:
    """siblings: the ids of the messages sharing this one's parent, itself included, oldest
    first ([itself] when not given)."""
    data = {
        "id": str(message.id),
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "finish_reason": message.finish_reason or None,
        "parent_id": str(message.parent_id) if message.parent_id else None,
        "siblings": [str(i) for i in (siblings or [message.id])],
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
    if message.role == Message.Role.ASSISTANT:
        preset = (message.generation or {}).get("preset")
        data["preset_name"] = preset["name"] if preset else None
        data["feedback"] = feedback_json(getattr(message, "feedback", None))
    return data


def preset_json(preset: Preset | None) -> dict | None:
    if preset is None:
        return None
    return {
        "id": preset.pk,
        "name": preset.name,
        "description": preset.description,
        "system_prompt": preset.system_prompt,
    }


def share_json(link: ShareLink | None) -> dict | None:
    if link is None:
        return None
    return {
        "url": reverse("chat:share", args=[link.token]),
        "show_owner": link.show_owner,
        "leaf_id": str(link.leaf_id),
        "created_at": link.created_at.isoformat(),
        "updated_at": link.updated_at.isoformat(),
    }


def conversation_json(conversation: Conversation, path=None) -> dict:
    """path: a selectors.ConversationPath; when given, its messages are included."""
    data = {
        "id": str(conversation.id),
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "model": conversation.model,
        "temperature": conversation.temperature,
        "top_p": conversation.top_p,
        "max_tokens": conversation.max_tokens,
        **{name: getattr(conversation, name) for name in sampling.NAMES},
        "preset": preset_json(conversation.preset),
        "source": conversation.source,
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
        "events_url": events_url(conversation.id),
    }
    if path is not None:
        data["messages"] = [message_json(m, path.siblings.get(m.id)) for m in path.messages]
    return data


def conversation_detail_json(detail) -> dict:
    """detail: a selectors.ConversationDetail: the conversation with its active path, its
    live share link and the reply streaming in it, which may be on another branch."""
    data = conversation_json(detail.conversation, detail.path)
    messages = detail.path.messages
    data["has_earlier"] = detail.path.has_earlier
    # The `before` that asks for the page before this one.
    data["earlier_cursor"] = str(messages[0].id) if detail.path.has_earlier else None
    data["share"] = share_json(detail.share)
    streaming = detail.streaming_reply
    data["streaming_reply"] = message_json(streaming) if streaming else None
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
