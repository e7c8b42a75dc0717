"""A long prompt's prefill progress over HTTP (llama.cpp server's `return_progress`), with
the fake engine prefilling at a known pace."""

from __future__ import annotations

import json
from typing import Any

from inference.fake_engine import PREFILL_CHUNK
from tests.inference.test_app import _client, _wait_ready
from tests.support.inference_app import fake_settings
from tests.support.sse import sse_data

PASTE = " ".join(f"word{i}" for i in range(300))  # 300 prompt tokens for the fake engine


def _chunks(**body: Any) -> list[dict]:
    settings = fake_settings(fake_prefill_tokens_per_second=50_000)
    request = {"messages": [{"role": "user", "content": PASTE}], "max_tokens": 3} | body
    with _client(settings) as c:
        _wait_ready(c)
        if not request.get("stream"):
            return [c.post("/v1/chat/completions", json=request).json()]
        with c.stream("POST", "/v1/chat/completions", json=request) as r:
            assert r.status_code == 200
            return [json.loads(d) for d in sse_data(r.iter_lines()) if d != "[DONE]"]


def test_a_stream_that_asks_is_told_how_far_its_prompt_got_before_the_first_token() -> None:
    chunks = _chunks(stream=True, return_progress=True)
    first_text = next(i for i, c in enumerate(chunks) if c["choices"])
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress and all("prompt_progress" in c for c in chunks[:first_text])
    assert not any("prompt_progress" in c for c in chunks[first_text:])
    figures = [c["prompt_progress"] for c in progress]
    # every step but the last (which gives the first token instead): 64, 128, 192, 256 of 300
    assert [f["processed"] for f in figures] == list(range(PREFILL_CHUNK, 300, PREFILL_CHUNK))
    assert {f["total"] for f in figures} == {300} and {f["cache"] for f in figures} == {0}
    times = [f["time_ms"] for f in figures]
    assert times == sorted(times) and all(isinstance(t, int) for t in times)
    assert all(c["object"] == "chat.completion.chunk" and c["choices"] == [] for c in progress)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[first_text:]) == (
        " ".join(PASTE.split()[:3])
    )


def test_no_progress_unless_asked() -> None:
    chunks = _chunks(stream=True)
    assert chunks and not any("prompt_progress" in c for c in chunks)


def test_progress_asked_without_a_stream_changes_nothing() -> None:
    (body,) = _chunks(return_progress=True)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == " ".join(PASTE.split()[:3])
