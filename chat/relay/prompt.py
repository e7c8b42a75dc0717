"""What the model is asked: the conversation's history, trimmed to fit its context."""

from django.conf import settings

from chat import selectors
from chat.inference_client import ChatRequest
from chat.models import Message

# A cautious guess for English text: real tokenizers average ~4 characters a token.
CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 4


def estimate_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE


def request_tokens(request: ChatRequest) -> int:
    """The prompt's size as the site guesses it, for servers that report no usage."""
    return sum(estimate_tokens(m["content"]) for m in request.messages)


def reply_max_tokens(conversation) -> int:
    wanted = conversation.max_tokens or settings.CHAT_DEFAULT_MAX_TOKENS
    return max(1, min(wanted, settings.INFERENCE_CONTEXT_TOKENS // 2))


def trim_to_budget(messages: list[dict], budget: int) -> list[dict]:
    """Drop the oldest turns until the rest fits; the system prompt and the question stay."""
    system = [m for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]
    used = sum(estimate_tokens(m["content"]) for m in system)
    kept: list[dict] = []
    for message in reversed(turns):
        cost = estimate_tokens(message["content"])
        if kept and used + cost > budget:
            break
        kept.append(message)
        used += cost
    kept.reverse()
    # Chat templates expect the first turn to be the user's.
    while len(kept) > 1 and kept[0]["role"] != "user":
        kept.pop(0)
    return system + kept


def _or_default(value: float | None, default: float) -> float:
    return default if value is None else value  # 0 is a real choice (greedy), not "unset"


def build_request(reply: Message) -> ChatRequest:
    conversation = reply.conversation
    messages = []
    if conversation.system_prompt:
        messages.append({"role": "system", "content": conversation.system_prompt})
    for message in selectors.prompt_history(reply=reply):
        if message.content:
            messages.append({"role": message.role, "content": message.content})
    max_tokens = reply_max_tokens(conversation)
    budget = settings.INFERENCE_CONTEXT_TOKENS - max_tokens
    return ChatRequest(
        messages=trim_to_budget(messages, budget),
        model=conversation.model or settings.INFERENCE_MODEL,
        max_tokens=max_tokens,
        temperature=_or_default(conversation.temperature, settings.CHAT_DEFAULT_TEMPERATURE),
        top_p=_or_default(conversation.top_p, settings.CHAT_DEFAULT_TOP_P),
    )
