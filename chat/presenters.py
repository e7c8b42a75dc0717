"""The JSON shapes of the site API."""

from chat.models import Conversation, Message
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
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
        "events_url": events_url(conversation.id),
    }
    if messages is not None:
        data["messages"] = [message_json(message) for message in messages]
    return data


def conversation_page_json(conversation: Conversation, page) -> dict:
    """One page of a conversation's messages (chat.selectors.MessagePage), newest page
    first: `earlier_cursor` is the `before` that asks for the page before it."""
    data = conversation_json(conversation, page.messages)
    data["has_earlier"] = page.has_earlier
    data["earlier_cursor"] = str(page.messages[0].id) if page.has_earlier else None
    return data
