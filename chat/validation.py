"""Parsing of JSON request bodies into checked values, with errors a person can read."""

import json
import math
import uuid

from django.conf import settings

from chat import sampling


class InvalidInput(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def parse_json_object(body: bytes) -> dict:
    if not body:
        return {}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("The request body is not valid UTF-8.") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise InvalidInput("The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise InvalidInput("The request body must be a JSON object.")
    return data


def clean_text(value, *, name: str, max_chars: int, required: bool) -> str:
    if value is None:
        if required:
            raise InvalidInput(f"`{name}` is required.")
        return ""
    if not isinstance(value, str):
        raise InvalidInput(f"`{name}` must be a string.")
    if "\x00" in value:
        raise InvalidInput(f"`{name}` must not contain NUL characters.")
    if any(0xD800 <= ord(char) <= 0xDFFF for char in value):
        raise InvalidInput(f"`{name}` must be valid Unicode text.")
    if required and not value.strip():
        raise InvalidInput(f"`{name}` must not be empty.")
    if len(value) > max_chars:
        raise InvalidInput(f"`{name}` is too long: at most {max_chars} characters.")
    return value


def clean_number(value, *, name: str, low: float, high: float, integer: bool = False):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"`{name}` must be a number or null.")
    if integer and not (isinstance(value, int) or float(value).is_integer()):
        raise InvalidInput(f"`{name}` must be a whole number.")
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidInput(f"`{name}` must be between {low:g} and {high:g}.")
    return int(value) if integer else float(value)


CONVERSATION_FIELDS = {
    "title",
    "system_prompt",
    "model",
    "temperature",
    "top_p",
    "max_tokens",
    "preset",
    *sampling.NAMES,
}
FEEDBACK_MAX_COMMENT_CHARS = 2000


def only_fields(data: dict, allowed: set) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise InvalidInput(f"Unknown field(s): {', '.join(sorted(unknown))}.")


def clean_id(value, *, name: str, required: bool = False) -> int | None:
    """A database id: a positive whole JSON number (or null when not required)."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = "" if required else " or null"
        raise InvalidInput(f"`{name}` must be a {name} id (a whole number){allowed}.")
    return value


def clean_uuid(value, *, name: str) -> uuid.UUID:
    if value is None:
        raise InvalidInput(f"`{name}` is required.")
    if not isinstance(value, str):
        raise InvalidInput(f"`{name}` must be a message id (a string).")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInput(f"`{name}` must be a message id.") from None


def _knob_cleaner(knob):
    return lambda v: clean_number(
        v, name=knob.name, low=knob.low, high=knob.high, integer=knob.integer
    )


def conversation_fields(data: dict, *, partial: bool) -> dict:
    """The checked fields; `preset` stays an id (or None) for the caller to look up."""
    only_fields(data, CONVERSATION_FIELDS)
    cleaners = {
        "title": lambda v: clean_text(
            v, name="title", max_chars=settings.CHAT_MAX_TITLE_CHARS, required=False
        ).strip(),
        "system_prompt": lambda v: clean_text(
            v, name="system_prompt", max_chars=settings.CHAT_MAX_SYSTEM_PROMPT_CHARS, required=False
        ),
        "model": lambda v: clean_text(v, name="model", max_chars=200, required=False).strip(),
        "temperature": lambda v: clean_number(v, name="temperature", low=0, high=2),
        # The servers refuse 0 (OpenAI: "greater than 0"); temperature 0 is the greedy choice.
        "top_p": lambda v: clean_number(v, name="top_p", low=0.01, high=1),
        "max_tokens": lambda v: clean_number(
            v, name="max_tokens", low=1, high=settings.INFERENCE_CONTEXT_TOKENS, integer=True
        ),
        "preset": lambda v: clean_id(v, name="preset"),
        **{knob.name: _knob_cleaner(knob) for knob in sampling.KNOBS},
    }
    return {name: cleaners[name](value) for name, value in data.items()}


def message_content(data: dict) -> str:
    only_fields(data, {"content"})
    return clean_text(
        data.get("content"),
        name="content",
        max_chars=settings.CHAT_MAX_MESSAGE_CHARS,
        required=True,
    )


MAX_PAGE_MESSAGES = 500


def page_params(query) -> tuple[uuid.UUID | None, int]:
    """`before` (a message id) and `limit` of GET /api/conversations/<id>/."""
    raw_limit = query.get("limit")
    limit = settings.CHAT_MESSAGES_PAGE_SIZE
    if raw_limit is not None:
        whole = raw_limit.isascii() and raw_limit.isdigit()
        if not whole or not 1 <= int(raw_limit) <= MAX_PAGE_MESSAGES:
            raise InvalidInput(f"`limit` must be a whole number from 1 to {MAX_PAGE_MESSAGES}.")
        limit = int(raw_limit)
    raw_before = query.get("before")
    if not raw_before:
        return None, limit
    try:
        return uuid.UUID(raw_before), limit
    except ValueError:
        raise InvalidInput("`before` must be the id of a message.") from None


def switch_target(data: dict) -> uuid.UUID:
    only_fields(data, {"message_id"})
    return clean_uuid(data.get("message_id"), name="message_id")


def feedback_fields(data: dict) -> tuple[str | None, str]:
    """(rating, comment): rating "up", "down" or None; the comment trimmed, maybe empty."""
    only_fields(data, {"rating", "comment"})
    if "rating" not in data:
        raise InvalidInput('`rating` is required: "up", "down" or null.')
    rating = data["rating"]
    if rating not in ("up", "down", None):
        raise InvalidInput('`rating` must be "up", "down" or null.')
    comment = clean_text(
        data.get("comment"), name="comment", max_chars=FEEDBACK_MAX_COMMENT_CHARS, required=False
    )
    return rating, comment.strip()


def share_fields(data: dict) -> bool:
    """show_owner: whether the shared page may show the owner's username (default no)."""
    only_fields(data, {"show_owner"})
    show_owner = data.get("show_owner", False)
    if not isinstance(show_owner, bool):
        raise InvalidInput("`show_owner` must be true or false.")
    return show_owner


def api_key_name(data: dict) -> str:
    unknown = set(data) - {"name"}
    if unknown:
        raise InvalidInput(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    return clean_text(data.get("name"), name="name", max_chars=100, required=False).strip()
