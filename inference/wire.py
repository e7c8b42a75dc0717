"""The OpenAI chat-completion wire format: chunks, full responses, errors, SSE framing."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from inference.sampling_params import TokenLogprob

# OpenAI reports an impossible token's logprob as -9999.0 (JSON has no -Infinity).
LOGPROB_FLOOR = -9999.0


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def logprobs_body(entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
    """OpenAI's `choices[0].logprobs`; None (JSON null) where the request did not ask."""
    if entries is None:
        return None
    return {"content": [_logprob_entry(e) for e in entries], "refusal": None}


def _logprob_entry(entry: TokenLogprob) -> dict[str, Any]:
    return _token(entry.token, entry.logprob) | {
        "top_logprobs": [_token(token, logprob) for token, logprob in entry.top]
    }


def _token(token: bytes, logprob: float) -> dict[str, Any]:
    return {
        "token": token.decode("utf-8", errors="replace"),
        "logprob": max(logprob, LOGPROB_FLOOR),
        "bytes": list(token),
    }


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class ChunkMaker:
    """Builds the chunks of one stream (same id, created and model for all of them)."""

    def __init__(self, request_id: str, model: str) -> None:
        self.id = f"chatcmpl-{request_id}"
        self.model = model
        self.created = int(time.time())
        self.role_sent = False

    def _chunk(self, choices: list[dict[str, Any]], ts: float, **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
            "x_ts": ts,
            **extra,
        }

    def delta(
        self, text: str, ts: float, logprobs: Sequence[TokenLogprob] | None = None
    ) -> dict[str, Any]:
        """logprobs: those of the tokens this text came from; None when not asked for."""
        delta: dict[str, Any] = {"content": text}
        if not self.role_sent:
            delta = {"role": "assistant", "content": text}
            self.role_sent = True
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": logprobs_body(logprobs),
            "finish_reason": None,
        }
        return self._chunk([choice], ts)

    def finish(
        self, reason: str, ts: float, logprobs: Sequence[TokenLogprob] | None = None
    ) -> dict[str, Any]:
        """logprobs: those of tokens that brought no text (held back, then cut by a stop string)."""
        delta: dict[str, Any] = {} if self.role_sent else {"role": "assistant", "content": ""}
        self.role_sent = True
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": logprobs_body(logprobs or None),
            "finish_reason": reason,
        }
        return self._chunk([choice], ts)

    def usage(self, prompt: int, completion: int, ts: float) -> dict[str, Any]:
        return self._chunk([], ts, usage=usage(prompt, completion))

    def progress(
        self, total: int, cached: int, processed: int, time_ms: int, ts: float
    ) -> dict[str, Any]:
        """llama.cpp server's `prompt_progress` chunk (return_progress): of `total` prompt
        tokens, `processed` are done, `cached` of them from the cache, in `time_ms` since the
        request arrived."""
        progress = {"total": total, "cache": cached, "processed": processed, "time_ms": time_ms}
        return self._chunk([], ts, prompt_progress=progress)


def completion(
    request_id: str,
    model: str,
    text: str,
    reason: str,
    prompt: int,
    completion_tokens: int,
    logprobs: Sequence[TokenLogprob] | None = None,
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs_body(logprobs),
                "finish_reason": reason,
            }
        ],
        "usage": usage(prompt, completion_tokens),
    }
