"""What the model is asked: the conversation's history, trimmed to fit its context."""

from django.conf import settings

from chat import sampling, selectors
from chat.inference_client import ChatRequest
from chat.models import Conversation, Message

# A cautious guess for English text: real tokenizers average ~4 characters a token.
CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 4


def estimate_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE


def request_tokens(request: ChatRequest) -> int:
    """The prompt's size as the site guesses it, for servers that report no usage."""
    return sum(estimate_tokens(m["content"]) for m in request.messages)


def reply_max_tokens(wanted: int | None) -> int:
    wanted = wanted or settings.CHAT_DEFAULT_MAX_TOKENS
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


def _first_set(*values):
    # 0 is a real choice (greedy), not "unset": only None falls through.
    return next((v for v in values if v is not None), None)


def generation_for(conversation: Conversation) -> dict:
    """What a new reply in this conversation is asked with: the conversation's own settings,
    else its preset's, else the site's defaults. Saved on the reply as its record."""
    preset = conversation.preset
    return {
        "preset": {"id": preset.pk, "name": preset.name} if preset else None,
        "system_prompt": conversation.system_prompt or (preset.system_prompt if preset else ""),
        "temperature": _first_set(
            conversation.temperature,
            preset and preset.temperature,
            settings.CHAT_DEFAULT_TEMPERATURE,
        ),
        "top_p": _first_set(
            conversation.top_p, preset and preset.top_p, settings.CHAT_DEFAULT_TOP_P
        ),
        "max_tokens": reply_max_tokens(
            _first_set(conversation.max_tokens, preset and preset.max_tokens)
        ),
        **{
            knob.name: _first_set(
                getattr(conversation, knob.name),
                preset and getattr(preset, knob.name),
                sampling.site_default(knob),
            )
            for knob in sampling.KNOBS
        },
    }


def _history(reply: Message, budget: int, path: list | None) -> list[dict]:
    """The newest turns, read until they alone overflow the budget (trim_to_budget then
    decides what of the last one read stays)."""
    turns, used = [], 0
    for role, content in selectors.prompt_history_newest_first(reply=reply, path=path):
        if not content:
            continue
        turns.append({"role": role, "content": content})
        used += estimate_tokens(content)
        if used > budget:
            break
    turns.reverse()
    return turns


def build_request(reply: Message, path: list | None = None) -> ChatRequest:
    """path: the ids from the first message to the reply's question when the caller knows
    them (selectors.prompt_history_newest_first)."""
    conversation = reply.conversation
    # A reply made before generation records existed is asked like a new one.
    generation = {**generation_for(conversation), **(reply.generation or {})}
    messages = []
    if generation["system_prompt"]:
        messages.append({"role": "system", "content": generation["system_prompt"]})
    max_tokens = generation["max_tokens"]
    budget = settings.INFERENCE_CONTEXT_TOKENS - max_tokens
    messages += _history(reply, budget, path)
    return ChatRequest(
        messages=trim_to_budget(messages, budget),
        model=conversation.model or settings.INFERENCE_MODEL,
        max_tokens=max_tokens,
        temperature=generation["temperature"],
        top_p=generation["top_p"],
        sampling={name: generation.get(name) for name in sampling.NAMES},
    )
