"""The OpenAI chat completions wire format of the site's own /v1 API: a request parsed into
what the services take, and the JSON of answers, stream chunks and errors, field for field
as OpenAI's API writes them (so the official clients read them unchanged)."""

import json
from dataclasses import dataclass, field

from django.conf import settings

from chat.validation import InvalidInput, clean_number, clean_text, parse_json_object

ROLES = {"system", "developer", "user", "assistant"}
MAX_MESSAGES = 1000
DONE = b"data: [DONE]\n\n"


class WireError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None) -> WireError:
    return WireError(400, message, param=param)


@dataclass
class CompletionRequest:
    system_prompt: str
    turns: list[tuple[str, str]]  # (role, content): user and assistant turns, oldest first
    conversation: dict = field(default_factory=dict)  # model and sampling, as stored
    stream: bool = False
    include_usage: bool = False


def _checked(param: str, clean, *args, **kwargs):
    """Run a validation.py cleaner, naming the field in OpenAI's `param` on failure."""
    try:
        return clean(*args, **kwargs)
    except InvalidInput as exc:
        raise invalid(exc.message, param) from None


def _text_of(content, param: str, *, required: bool) -> str:
    """A message's text: a string, null, or a list of content parts of which the `text`
    parts count (the other kinds carry nothing a text model reads)."""
    if isinstance(content, list):
        texts = [
            part.get("text")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        ]
        if not all(isinstance(text, str) for text in texts):
            raise invalid(f"`{param}` has a text part without text.", param)
        content = "".join(texts)
    return _checked(
        param,
        clean_text,
        content,
        name=param,
        max_chars=settings.CHAT_MAX_MESSAGE_CHARS,
        required=required,
    )


def _messages(data: dict) -> tuple[str, list[tuple[str, str]]]:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("`messages` must be a non-empty list.", "messages")
    if len(messages) > MAX_MESSAGES:
        raise invalid(f"`messages` may hold at most {MAX_MESSAGES} messages.", "messages")
    system, turns = [], []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise invalid(
                f"`{param}.role` must be one of: system, developer, user, assistant.",
                f"{param}.role",
            )
        last = index == len(messages) - 1
        text = _text_of(message.get("content"), f"{param}.content", required=last)
        if message["role"] in ("system", "developer"):
            system.append(text)
        else:
            turns.append((message["role"], text))
    if messages[-1]["role"] != "user":
        raise invalid("The last message must be the user's (role `user`).", "messages")
    system_prompt = "\n\n".join(text for text in system if text)
    _checked(
        "messages",
        clean_text,
        system_prompt,
        name="the system messages",
        max_chars=settings.CHAT_MAX_SYSTEM_PROMPT_CHARS,
        required=False,
    )
    return system_prompt, turns


def _sampling(data: dict) -> dict:
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > 200):
        raise invalid("`model` must be a string of at most 200 characters.", "model")
    if data.get("n") not in (None, 1):
        raise invalid("Only `n` = 1 is supported.", "n")
    wanted = (
        "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    )
    return {
        "model": (model or "").strip(),
        "temperature": _checked(
            "temperature", clean_number, data.get("temperature"), name="temperature", low=0, high=2
        ),
        "top_p": _checked("top_p", clean_number, data.get("top_p"), name="top_p", low=0, high=1),
        "max_tokens": _checked(
            wanted,
            clean_number,
            data.get(wanted),
            name=wanted,
            low=1,
            high=settings.INFERENCE_CONTEXT_TOKENS,
            integer=True,
        ),
    }


def _streaming(data: dict) -> tuple[bool, bool]:
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("`stream` must be true or false.", "stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise invalid("`stream_options` must be an object.", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise invalid(
            "`stream_options.include_usage` must be true or false.", "stream_options.include_usage"
        )
    return bool(stream), include_usage


def parse_request(body: bytes) -> CompletionRequest:
    """Fields OpenAI defines that this site does not implement (stop, seed, tools, …) are
    accepted and ignored, like the inference server does."""
    try:
        data = parse_json_object(body)
    except InvalidInput as exc:
        raise invalid(exc.message) from None
    system_prompt, turns = _messages(data)
    stream, include_usage = _streaming(data)
    return CompletionRequest(
        system_prompt=system_prompt,
        turns=turns,
        conversation=_sampling(data),
        stream=stream,
        include_usage=include_usage,
    )


# --- answers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """What every chunk or answer of one call repeats."""

    id: str
    created: int
    model: str


def finish_reason(saved: str) -> str:
    # A reply stopped from the page ends as "cancelled", which OpenAI's format lacks.
    return saved if saved in ("stop", "length") else "stop"


def usage_json(fields: dict) -> dict:
    prompt = fields.get("prompt_tokens") or 0
    completion = fields.get("completion_tokens") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_json(call: Completion, fields: dict) -> dict:
    return {
        "id": call.id,
        "object": "chat.completion",
        "created": call.created,
        "model": call.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": fields["content"], "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason(fields.get("finish_reason") or ""),
            }
        ],
        "usage": usage_json(fields),
    }


def chunk_json(
    call: Completion, delta: dict, *, finish: str | None = None, with_usage: bool = False
) -> dict:
    chunk = {
        "id": call.id,
        "object": "chat.completion.chunk",
        "created": call.created,
        "model": call.model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if with_usage:
        chunk["usage"] = None  # as OpenAI does on every chunk but the last when asked
    return chunk


def usage_chunk_json(call: Completion, fields: dict) -> dict:
    return {
        "id": call.id,
        "object": "chat.completion.chunk",
        "created": call.created,
        "model": call.model,
        "system_fingerprint": None,
        "choices": [],
        "usage": usage_json(fields),
    }


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def model_json(model: dict) -> dict:
    """An entry of GET /v1/models: the inference server's, with OpenAI's fields ensured."""
    return {"object": "model", "created": 0, "owned_by": "tokenstream", **model}


# The status and type a failed reply is answered with, by the relay's failure kind.
FAILURES = {
    "model": (404, "invalid_request_error", "model_not_found"),
    "refused": (400, "invalid_request_error", None),
    "busy": (503, "server_error", "server_overloaded"),
    "rate_limited": (503, "server_error", "server_overloaded"),
    "unavailable": (503, "server_error", "service_unavailable"),
}


def reply_failed(kind: str | None, message: str) -> WireError:
    status, type_, code = FAILURES.get(kind or "", (500, "server_error", None))
    return WireError(status, message, type=type_, code=code)
