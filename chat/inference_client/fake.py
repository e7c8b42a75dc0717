"""An in-process stand-in for the inference server, for fast tests: it streams back the
words of the last user message, one token per word with its leading space."""

import asyncio
import re

from django.conf import settings

from chat.inference_client.base import ChatRequest, Delta, Finish, InferenceClient


class FakeInferenceClient(InferenceClient):
    model = "fake-echo"

    async def stream_chat(self, request: ChatRequest, on_delta=None):
        last = next((m["content"] for m in reversed(request.messages) if m["role"] == "user"), "")
        words = re.findall(r"\s*\S+", last)
        limit = request.max_tokens or len(words)
        delay = 1 / settings.FAKE_TOKENS_PER_SECOND if settings.FAKE_TOKENS_PER_SECOND > 0 else 0
        for word in words[:limit]:
            await asyncio.sleep(delay)
            yield Delta(word)
        reason = "length" if len(words) > limit else "stop"
        usage = {"prompt_tokens": len(last.split()), "completion_tokens": min(limit, len(words))}
        yield Finish(reason, usage)

    async def list_models(self) -> list[dict]:
        return [{"id": self.model, "context_length": settings.INFERENCE_CONTEXT_TOKENS}]
