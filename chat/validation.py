"""Parsing of JSON request bodies into checked values, with errors a person can read."""

import json
import math

from django.conf import settings


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


CONVERSATION_FIELDS = {"title", "system_prompt", "model", "temperature", "top_p", "max_tokens"}


def conversation_fields(data: dict, *, partial: bool) -> dict:
    unknown = set(data) - CONVERSATION_FIELDS
    if unknown:
        raise InvalidInput(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    cleaners = {
        "title": lambda v: clean_text(
            v, name="title", max_chars=settings.CHAT_MAX_TITLE_CHARS, required=False
        ).strip(),
        "system_prompt": lambda v: clean_text(
            v, name="system_prompt", max_chars=settings.CHAT_MAX_SYSTEM_PROMPT_CHARS, required=False
        ),
        "model": lambda v: clean_text(v, name="model", max_chars=200, required=False).strip(),
        "temperature": lambda v: clean_number(v, name="temperature", low=0, high=2),
        "top_p": lambda v: clean_number(v, name="top_p", low=0, high=1),
        "max_tokens": lambda v: clean_number(
            v, name="max_tokens", low=1, high=settings.INFERENCE_CONTEXT_TOKENS, integer=True
        ),
    }
    return {name: cleaners[name](value) for name, value in data.items()}


def message_content(data: dict) -> str:
    unknown = set(data) - {"content"}
    if unknown:
        raise InvalidInput(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    return clean_text(
        data.get("content"),
        name="content",
        max_chars=settings.CHAT_MAX_MESSAGE_CHARS,
        required=True,
    )


def api_key_name(data: dict) -> str:
    unknown = set(data) - {"name"}
    if unknown:
        raise InvalidInput(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    return clean_text(data.get("name"), name="name", max_chars=100, required=False).strip()
