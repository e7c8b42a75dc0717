"""The real bundled model over HTTP (one server and one loaded model for the session)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest

from tests.support.inference_app import LiveServer
from tests.support.sse import sse_data

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"


def _chat(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}]} | kw


def _stream_text(server: LiveServer, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body | {"stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200
        data = list(sse_data(r.iter_lines()))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return text, chunks


def test_models_lists_the_served_model(live_model: LiveServer) -> None:
    card = httpx.get(f"{live_model.url}/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["context_length"] == 8192


def test_capital_of_france_wire_format(live_model: LiveServer) -> None:
    body = _chat(
        "What is the capital of France?",
        temperature=0,
        max_tokens=12,
        stream_options={"include_usage": True},
    )
    text, chunks = _stream_text(live_model, body)
    assert "Paris" in text and "\ufffd" not in text
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["prompt_tokens"] > 20
    assert usage["completion_tokens"] <= 12
    assert all("x_ts" in c for c in chunks)


def test_temperature_zero_is_deterministic(live_model: LiveServer) -> None:
    body = _chat("Name three colors.", temperature=0, max_tokens=10)
    runs = [
        httpx.post(f"{live_model.url}/v1/chat/completions", json=body, timeout=60).json()
        for _ in range(2)
    ]
    assert runs[0]["choices"][0]["message"] == runs[1]["choices"][0]["message"]
    assert runs[0]["choices"][0]["finish_reason"] in ("stop", "length")


def test_seed_is_honoured(live_model: LiveServer) -> None:
    body = _chat("Write a word.", temperature=1.0, top_p=0.95, seed=1234, max_tokens=10)
    texts = {_stream_text(live_model, body)[0] for _ in range(2)}
    assert len(texts) == 1


def test_max_tokens_gives_length(live_model: LiveServer) -> None:
    r = httpx.post(
        f"{live_model.url}/v1/chat/completions",
        json=_chat("Tell me a long story.", temperature=0, max_tokens=3),
        timeout=60,
    ).json()
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 3


def test_second_stream_starts_before_first_ends(live_model: LiveServer) -> None:
    long = _chat("Count from 1 to 100.", temperature=0, max_tokens=40, stream=True, ignore_eos=True)
    short = _chat("Say hi.", temperature=0, max_tokens=3)
    with httpx.Client(base_url=live_model.url, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=long) as first:
            lines = sse_data(first.iter_lines())
            next(lines)
            started = time.monotonic()
            with c.stream("POST", "/v1/chat/completions", json=short | {"stream": True}) as second:
                events = sse_data(second.iter_lines())
                first_of_second = json.loads(next(events))
                assert list(events)[-1] == "[DONE]"
            rest = [d for d in lines]
    last_of_first = json.loads([d for d in rest if d != "[DONE]"][-1])
    assert first_of_second["x_ts"] < last_of_first["x_ts"]
    assert time.monotonic() - started < 30


def test_a_repeated_prompt_is_served_from_the_prefix_cache(live_model: LiveServer) -> None:
    body = _chat("Describe a lighthouse at night, in detail. " * 8, temperature=0, max_tokens=4)
    before = _metric(live_model, "inference_prefix_cache_hit_tokens_total")
    for _ in range(2):
        httpx.post(
            f"{live_model.url}/v1/chat/completions", json=body, timeout=60
        ).raise_for_status()
    assert _metric(live_model, "inference_prefix_cache_hit_tokens_total") - before >= 64
    assert 0 < _metric(live_model, "inference_prefix_cache_hit_rate") <= 1
    assert (
        0
        < _metric(live_model, "inference_prefix_cache_bytes")
        <= _metric(live_model, "inference_prefix_cache_capacity_bytes")
    )


def test_disconnect_frees_the_sequence(live_model: LiveServer) -> None:
    body = _chat(
        "Write a very long essay about the sea.", max_tokens=500, stream=True, ignore_eos=True
    )
    with httpx.Client(base_url=live_model.url, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = sse_data(r.iter_lines())
            next(lines)
            next(lines)
            assert _running(live_model) >= 1
        deadline = time.monotonic() + 10
        while _running(live_model) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _running(live_model) == 0


def _running(server: LiveServer) -> float:
    return _metric(server, "inference_running_sequences")


def _metric(server: LiveServer, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", httpx.get(f"{server.url}/metrics").text, re.M)
    assert m
    return float(m.group(1))
