"""OpenAI-shaped request and response bodies of the chat completions API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inference.sampling_params import SamplingParams


class ChatMessage(BaseModel):
    # Unknown fields (name, tool_calls...) are tolerated like OpenAI does.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = ""

    def text(self) -> str:
        """Content as plain text; OpenAI 'content parts' keep only their text parts."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class StreamOptions(BaseModel):
    include_usage: bool = False


def _absent(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


def _one_of(*harmless: Any) -> Callable[[Any], bool]:
    return lambda value: _absent(value) or value in harmless


# Fields that would change the reply but that this server does not implement, each with the
# values that mean "not used": a request that uses one gets a 400 naming it, never a reply
# that silently ignored it. Fields that change nothing here (user, metadata, store,
# service_tier, parallel_tool_calls...) and fields we do not know pass, as with vLLM.
UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "tools": _absent,
    "tool_choice": _one_of("none"),
    "functions": _absent,
    "function_call": _one_of("none"),
    "response_format": _one_of({"type": "text"}),
    "n": _one_of(1),
    "best_of": _one_of(1),
    "echo": _absent,
    "suffix": _absent,
    "audio": _absent,
    "modalities": _one_of(["text"]),
    "reasoning_effort": _absent,
    "web_search_options": _absent,
    "use_beam_search": _absent,
    "min_tokens": _one_of(0),
    "stop_token_ids": _absent,
    "bad_words": _absent,
    "allowed_token_ids": _absent,
    "typical_p": _one_of(1, 1.0),
    "prompt_logprobs": _absent,
    "truncate_prompt_tokens": _absent,
    "include_stop_str_in_output": _absent,
    "skip_special_tokens": _one_of(True),
    "add_generation_prompt": _one_of(True),
    "continue_final_message": _absent,
    "chat_template": _absent,
    "chat_template_kwargs": _absent,
    "documents": _absent,
    "structured_outputs": _absent,
}
UNSUPPORTED_PREFIXES = ("guided_",)  # vLLM's guided decoding: guided_json, guided_regex...


# Fields passed to the sampler as given; null or absent: SamplingParams' default.
KNOBS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "top_logprobs",
    "seed",
)


class ChatCompletionRequest(BaseModel):
    """OpenAI's request body plus vLLM's sampling extensions (meanings: sampling_params).
    A null sampling field means its default, as OpenAI's API reads it."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM: 0 or -1 = off
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM extension: keep generating past end-of-sequence
    # llama.cpp server's extension: with `stream`, `prompt_progress` chunks while the prompt
    # is prefilled (ignored without `stream`)
    return_progress: bool = False

    @field_validator("stop", mode="after")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        return [s for s in stops if s]

    @field_validator("logit_bias", mode="after")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        bad = [key for key in value or {} if not key.isdigit()]
        if bad:
            raise ValueError(
                f"keys must be token ids (non-negative integers as strings), not {bad}"
            )
        return value

    def refused(self) -> tuple[str, str, str] | None:
        """(param, code, message) when the request is well-formed but cannot be served as asked."""
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "invalid_request", "top_logprobs needs logprobs: true"
        for name, value in (self.model_extra or {}).items():
            unused = UNSUPPORTED.get(name) or (
                _absent if name.startswith(UNSUPPORTED_PREFIXES) else None
            )
            if unused is not None and not unused(value):
                return (
                    name,
                    "unsupported_parameter",
                    f"'{name}' is not supported by this server (got {repr(value)[:60]})",
                )
        return None

    def sampling(self, max_tokens: int) -> SamplingParams:
        given = {name: getattr(self, name) for name in KNOBS if getattr(self, name) is not None}
        return SamplingParams(
            max_tokens=max_tokens,
            **given,
            top_k=max(0, self.top_k or 0),
            logit_bias=tuple((int(token), bias) for token, bias in (self.logit_bias or {}).items()),
            logprobs=bool(self.logprobs),
            stop=tuple(self.stop or ()),
            ignore_eos=self.ignore_eos,
            return_progress=self.return_progress and self.stream,
        )

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenstream"
    context_length: int
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
