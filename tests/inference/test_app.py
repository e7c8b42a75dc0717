"""The HTTP API with the fake engine, in-process (TestClient runs the app's lifespan)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from inference.app import create_app
from inference.fake_engine import FakeBackend, FakeEngine
from inference.settings import Settings
from tests.support.inference_app import fake_settings
from tests.support.sse import sse_data

TEXT = "The quick brown fox jumps over the lazy dog"
WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog"]


def _client(settings: Settings, engine: Any = None) -> TestClient:
    return TestClient(create_app(settings, engine=engine), raise_server_exceptions=False)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with _client(fake_settings()) as c:
        _wait_ready(c)
        yield c


def _wait_ready(c: TestClient) -> None:
    deadline = time.monotonic() + 5
    while c.get("/ready").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _body(**kw: Any) -> dict[str, Any]:
    return {"model": "fake", "messages": [{"role": "user", "content": TEXT}]} | kw


def _stream(c: TestClient, **kw: Any) -> list[str]:
    with c.stream("POST", "/v1/chat/completions", json=_body(stream=True, **kw)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(sse_data(r.iter_lines()))


def _error(r: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    return err


def test_health_ready_models_metrics(client: TestClient) -> None:
    assert client.get("/health").status_code == 200
    ready = client.get("/ready")
    assert ready.status_code == 200 and ready.json()["model"] == "fake"
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "fake" and models["data"][0]["context_length"] == 4096
    client.post("/v1/chat/completions", json=_body())
    text = client.get("/metrics").text
    for name in (
        "inference_requests_total",
        "inference_queue_depth",
        "inference_running_sequences",
        "inference_time_to_first_token_seconds_bucket",
        "inference_inter_token_latency_seconds_bucket",
        "inference_generated_tokens_total",
        "inference_prefix_cache_hit_rate",
        "inference_prefix_cache_bytes",
        "inference_prefix_cache_capacity_bytes",
        "inference_prefix_cache_kept_reply_bytes",
        "inference_prefix_cache_hit_tokens_total",
        "inference_prefix_cache_query_tokens_total",
        "inference_prefix_cache_evicted_blocks_total",
    ):
        assert name in text
    assert 'inference_requests_total{outcome="ok"} 1.0' in text
    assert "inference_generated_tokens_total 9.0" in text


def test_metrics_count_the_model_threads_steps_by_kind(client: TestClient) -> None:
    def steps(kind: str) -> float:
        text = client.get("/metrics").text
        line = f'inference_model_steps_total{{kind="{kind}"}} '
        (value,) = [row[len(line) :] for row in text.splitlines() if row.startswith(line)]
        return float(value)

    assert 'inference_model_step_seconds_total{kind="decode"}' in client.get("/metrics").text
    before = {kind: steps(kind) for kind in ("prefill", "decode")}
    client.post("/v1/chat/completions", json=_body())
    # the fake engine's reply: a prefill step for the prompt, then a decode step per token
    assert steps("prefill") >= before["prefill"] + 1
    assert steps("decode") >= before["decode"] + 8


def test_stream_wire_format(client: TestClient) -> None:
    data = _stream(client, stream_options={"include_usage": True})
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    usage, final, tokens = chunks[-1], chunks[-2], chunks[:-2]
    assert [c["choices"][0]["delta"]["content"] for c in tokens] == WORDS
    assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in tokens[1:])
    assert final["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 9
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 9
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["model"] == "fake"
        assert isinstance(c["x_ts"], float) and c["id"] == chunks[0]["id"]
    assert [c["x_ts"] for c in chunks] == sorted(c["x_ts"] for c in chunks)


def test_stream_without_usage_and_max_tokens(client: TestClient) -> None:
    data = _stream(client, max_tokens=3)
    chunks = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]" and all("usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "The quick brown"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_non_stream_completion(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=_body(max_completion_tokens=4))
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "The quick brown fox"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("model", [None, ""])
def test_absent_or_empty_model_means_default(client: TestClient, model: str | None) -> None:
    body = _body()
    body["model"] = model
    if model is None:
        del body["model"]
    assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_stop_strings_never_emitted(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=_body(stop=[" jumps over"]))
    assert r.json()["choices"][0]["message"]["content"] == "The quick brown fox"
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    data = _stream(client, stop="n f")  # spans two tokens: "brow|n| f|ox"
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-1])
    assert text == "The quick brow"


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"model": "fake"},
        {"model": "fake", "messages": [{"role": "wizard", "content": "x"}]},
        {"model": "fake", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        {"model": "fake", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
    ],
)
def test_bad_body_is_400_not_422(client: TestClient, body: dict[str, Any]) -> None:
    _error(client.post("/v1/chat/completions", json=body), 400)


def test_not_json_is_400(client: TestClient) -> None:
    r = client.post(
        "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    _error(r, 400)


def test_unknown_model_is_404(client: TestClient) -> None:
    _error(client.post("/v1/chat/completions", json=_body(model="gpt-9")), 404, "model_not_found")


def test_unknown_route_is_openai_shaped(client: TestClient) -> None:
    _error(client.get("/v1/nothing"), 404)


def test_context_length_exceeded() -> None:
    with _client(fake_settings(context_length=5)) as c:
        _wait_ready(c)
        _error(c.post("/v1/chat/completions", json=_body()), 400, "context_length_exceeded")


def test_api_key() -> None:
    with _client(fake_settings(inference_api_key="s3cret")) as c:
        _wait_ready(c)
        _error(c.post("/v1/chat/completions", json=_body()), 401, "invalid_api_key")
        bad = {"Authorization": "Bearer nope"}
        _error(c.post("/v1/chat/completions", json=_body(), headers=bad), 401)
        _error(c.get("/v1/models"), 401)
        good = {"Authorization": "Bearer s3cret"}
        assert c.post("/v1/chat/completions", json=_body(), headers=good).status_code == 200
        assert c.get("/health").status_code == 200  # probes need no key


class _GatedEngine(FakeEngine):
    def __init__(self, settings: Settings, gate: threading.Event) -> None:
        super().__init__(settings)
        self.gate = gate

    async def _warm_up(self) -> None:
        import asyncio

        await asyncio.to_thread(self.gate.wait, 10)


def test_ready_is_503_until_warm_up_ran() -> None:
    gate = threading.Event()
    settings = fake_settings()
    with _client(settings, _GatedEngine(settings, gate)) as c:
        r = c.get("/ready")
        assert r.status_code == 503 and "retry-after" in r.headers
        assert c.get("/health").status_code == 200
        _error(c.post("/v1/chat/completions", json=_body()), 503, "model_not_ready")
        gate.set()
        _wait_ready(c)


class _BrokenBackend(FakeBackend):
    def decode(self, seqs: Any) -> list[int]:
        if any(len(s.generated) >= 2 for s in seqs):
            raise RuntimeError("boom")
        return super().decode(seqs)


class _BrokenEngine(FakeEngine):
    def _backend(self) -> FakeBackend:
        return _BrokenBackend(0)


def test_failure_mid_stream_is_one_error_chunk() -> None:
    settings = fake_settings()
    with _client(settings, _BrokenEngine(settings)) as c:
        _wait_ready(c)
        data = _stream(c)
        assert len(data) == 3 and "[DONE]" not in data
        assert json.loads(data[-1])["error"]["message"].endswith("boom")
        # the engine survives: a short request still works
        assert c.post("/v1/chat/completions", json=_body(max_tokens=2)).status_code == 200


# --- sampling controls: validation and logprobs on the wire --------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("frequency_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("presence_penalty", 3),
        ("repetition_penalty", 0),
        ("repetition_penalty", -1.0),
        ("top_k", -2),
        ("min_p", 1.5),
        ("min_p", -0.1),
        ("top_logprobs", 21),
        ("top_logprobs", -1),
        ("temperature", 2.5),
        ("top_p", 0),
        ("logit_bias", {"5": 101}),
        ("logit_bias", {"5": -100.5}),
        ("logit_bias", {"hello": 1}),
        ("logprobs", "maybe"),
    ],
)
def test_out_of_range_sampling_field_is_400_naming_it(
    client: TestClient, field: str, value: Any
) -> None:
    err = _error(client.post("/v1/chat/completions", json=_body(**{field: value})), 400)
    assert err["param"] == field and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "auto"),
        ("functions", [{"name": "f"}]),
        ("response_format", {"type": "json_object"}),
        ("n", 2),
        ("best_of", 3),
        ("echo", True),
        ("suffix", "!"),
        ("guided_json", {"type": "object"}),
        ("guided_choice", ["a", "b"]),
        ("min_tokens", 5),
        ("use_beam_search", True),
    ],
)
def test_a_field_that_would_change_the_reply_but_is_not_implemented_is_400(
    client: TestClient, field: str, value: Any
) -> None:
    err = _error(
        client.post("/v1/chat/completions", json=_body(**{field: value})),
        400,
        "unsupported_parameter",
    )
    assert err["param"] == field


@pytest.mark.parametrize(
    "extra",
    [
        {"user": "u1", "metadata": {"a": "b"}, "store": False, "service_tier": "auto"},
        {
            "n": 1,
            "response_format": {"type": "text"},
            "tool_choice": "none",
            "tools": [],
            "echo": False,
            "guided_json": None,
            "parallel_tool_calls": True,
        },
        {
            "frequency_penalty": 0.5,
            "presence_penalty": -0.5,
            "repetition_penalty": 1.1,
            "top_k": -1,
            "min_p": 0.05,
            "logit_bias": {"3": -100},
            "temperature": None,
            "top_p": None,
        },
    ],
)
def test_informative_fields_and_neutral_values_pass(
    client: TestClient, extra: dict[str, Any]
) -> None:
    r = client.post("/v1/chat/completions", json=_body(**extra))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == TEXT


def test_top_logprobs_needs_logprobs(client: TestClient) -> None:
    err = _error(client.post("/v1/chat/completions", json=_body(top_logprobs=2)), 400)
    assert err["param"] == "top_logprobs"


class _SmallVocabEngine(FakeEngine):
    vocab_size = 10


def test_logit_bias_outside_the_vocabulary_is_400() -> None:
    settings = fake_settings()
    with _client(settings, _SmallVocabEngine(settings)) as c:
        _wait_ready(c)
        err = _error(
            c.post("/v1/chat/completions", json=_body(logit_bias={"10": 1})), 400, "invalid_value"
        )
        assert err["param"] == "logit_bias"
        assert c.post("/v1/chat/completions", json=_body(logit_bias={"9": 1})).status_code == 200


def _assert_logprob_entry(entry: dict[str, Any], word: str, top: int) -> None:
    assert (
        entry["token"] == word and entry["bytes"] == list(word.encode()) and entry["logprob"] == 0.0
    )
    assert len(entry["top_logprobs"]) == top
    if top:
        assert entry["top_logprobs"][0] == {
            "token": word,
            "logprob": 0.0,
            "bytes": list(word.encode()),
        }
        # an impossible token: OpenAI's -9999.0, since JSON has no -Infinity
        assert all(t["logprob"] == -9999.0 for t in entry["top_logprobs"][1:])


def test_streamed_logprobs_have_openais_chunk_shape(client: TestClient) -> None:
    data = _stream(client, logprobs=True, top_logprobs=3, stream_options={"include_usage": True})
    chunks = [json.loads(d) for d in data[:-1]]
    tokens, final, usage = chunks[:-2], chunks[-2], chunks[-1]
    for chunk, word in zip(tokens, WORDS, strict=True):
        logprobs = chunk["choices"][0]["logprobs"]
        assert set(logprobs) == {"content", "refusal"} and len(logprobs["content"]) == 1
        _assert_logprob_entry(logprobs["content"][0], word, 3)
    assert final["choices"][0]["logprobs"] is None
    assert usage["usage"]["completion_tokens"] == len(WORDS)


def test_non_streamed_logprobs_cover_every_token(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=_body(logprobs=True, max_tokens=4))
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == WORDS[:4]
    for entry, word in zip(content, WORDS, strict=False):
        _assert_logprob_entry(entry, word, 0)


def test_no_logprobs_unless_asked(client: TestClient) -> None:
    chunks = [json.loads(d) for d in _stream(client)[:-1]]
    assert all(c["choices"][0]["logprobs"] is None for c in chunks if c["choices"])
    r = client.post("/v1/chat/completions", json=_body())
    assert r.json()["choices"][0]["logprobs"] is None


def test_logprobs_of_tokens_cut_by_a_stop_string_still_come(client: TestClient) -> None:
    """One entry per generated token, held-back ones included: they arrive with the finish."""
    r = client.post("/v1/chat/completions", json=_body(logprobs=True, stop=[" jumps over"])).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert r["choices"][0]["message"]["content"] == "The quick brown fox"
    assert len(content) == r["usage"]["completion_tokens"] == 6
    data = _stream(client, logprobs=True, stop=[" jumps over"])
    streamed = [
        e
        for d in data[:-1]
        for e in (json.loads(d)["choices"][0]["logprobs"] or {}).get("content", [])
    ]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
