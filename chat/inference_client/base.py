"""What every inference client backend speaks: the request, the streamed items, the error."""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    model: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    # More sampling settings by their OpenAI/vLLM names (chat/sampling.py); None: not sent.
    sampling: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Delta:
    text: str
    produced_at: float | None = None  # the server's monotonic clock, when it says


@dataclass(frozen=True)
class Progress:
    """How far the server has got through the prompt before the first token (a server that
    reports it: llama.cpp's `prompt_progress`, which ours speaks too)."""

    processed: int
    total: int
    cached: int = 0


@dataclass(frozen=True)
class Finish:
    reason: str
    usage: dict = field(default_factory=dict)


class InferenceError(Exception):
    """A failure told to the user as `message` (a sentence a person understands)."""

    def __init__(self, message: str, *, retryable: bool, kind: str):
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.kind = kind


# on_delta(text, produced_at): see InferenceClient.stream_chat.
OnDelta = Callable[[str, float | None], None]


class InferenceClient:
    def stream_chat(
        self, request: ChatRequest, on_delta: OnDelta | None = None
    ) -> AsyncIterator[Delta | Finish]:
        """Yield Delta items then exactly one Finish (Progress items may come before the
        first Delta); raise InferenceError on failure.
        With on_delta, a backend may instead hand a Delta's text to on_delta as it arrives,
        called on the loop in its place among the items (each Delta handed or yielded, never
        both): the relay's hot path then wakes no task per token. A backend may ignore it."""
        raise NotImplementedError

    async def list_models(self) -> list[dict]:
        raise NotImplementedError

    async def default_model(self) -> str:
        """The model a request without `model` gets; cached after the first answer."""
        if not getattr(self, "_default_model", ""):
            models = await self.list_models()
            self._default_model = models[0]["id"] if models else ""
        return self._default_model or "default"

    async def aclose(self) -> None:
        return None
