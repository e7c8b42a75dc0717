"""The HTTP client's reading of a chunk: the shape most chunks have is read without
json.loads, and must give exactly what json.loads gives (chat/inference_client/http.py)."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chat.inference_client.http import _text_chunk
from inference.wire import ChunkMaker


def by_json(payload: bytes) -> tuple[str | None, object]:
    """What the general path takes from a one-choice text chunk."""
    chunk = json.loads(payload)
    assert "error" not in chunk and not chunk.get("usage")
    [choice] = chunk["choices"]
    assert choice.get("finish_reason") is None
    return choice["delta"].get("content"), chunk.get("x_ts")


def chunks(text: str, ts, first: bool) -> list[bytes]:
    """A text chunk as our server writes it (json.dumps' spacing, not ASCII-escaped) and
    as compact JSON (vLLM and others), ASCII-escaped or not."""
    maker = ChunkMaker("req-1", "SmolLM2-135M-Instruct")
    maker.role_sent = not first
    body = maker.delta(text, ts)
    # surrogatepass: a lone surrogate written raw is still read by json.loads.
    return [
        json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass"),
        json.dumps(body, separators=(",", ":")).encode(),
        json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        ),
    ]


@pytest.mark.parametrize(
    "text",
    [" word", "", 'say "hi"', "back\\slash", "line\nbreak\ttab", "é 中文 🙂", "\u0001", "\ud800"],
)
@pytest.mark.parametrize("ts", [1764567890.123456, 12, 1e-7, None])
def test_a_text_chunk_reads_as_json_loads_reads_it(text, ts):
    for first in (True, False):
        for payload in chunks(text, ts, first):
            known = _text_chunk(payload)
            assert known is not None, payload
            assert known == by_json(payload)
            assert type(known[1]) is type(by_json(payload)[1])


@given(
    text=st.text(),
    ts=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False), st.integers()),
)
def test_any_text_and_timestamp_read_as_json_loads_reads_them(text, ts):
    for payload in chunks(text, ts, first=False):
        known = _text_chunk(payload)
        assert known is not None, payload
        assert known == by_json(payload)
        assert type(known[1]) is type(by_json(payload)[1])


@pytest.mark.parametrize(
    "body",
    [
        # the finish, usage and error chunks, two choices, a key more, an escaped name
        lambda m: m.finish("stop", 1.0),
        lambda m: m.usage(3, 4, 1.0),
        lambda m: {"error": {"message": "CUDA fell over"}},
        lambda m: m.delta("a", 1.0) | {"choices": [m.delta("a", 1.0)["choices"][0]] * 2},
        lambda m: m.delta("a", 1.0) | {"service_tier": "default"},
        lambda m: m.delta("a", 1.0) | {"model": "org/model"},
    ],
)
def test_other_chunks_go_through_json_loads(body):
    maker = ChunkMaker("req-1", "m")
    maker.role_sent = True
    payload = json.dumps(body(maker)).replace("/", "\\/").encode()
    assert _text_chunk(payload) is None


def test_other_spacing_goes_through_json_loads():
    payload = (
        b'{"id":"x", "object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]} '
    )
    assert _text_chunk(payload) is None
    assert json.loads(payload)["choices"][0]["delta"]["content"] == "a"


@pytest.mark.parametrize(
    "payload",
    [
        # leading zeros, a raw control character
        b'{"id":"x","object":"chat.completion.chunk","created":01,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}',
        b'{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"a\nb"},"logprobs":null,"finish_reason":null}]}',
    ],
)
def test_what_json_loads_refuses_is_not_read_as_text(payload):
    assert _text_chunk(payload) is None
    with pytest.raises(ValueError):
        json.loads(payload)


def test_a_bad_escape_is_the_error_json_loads_gives():
    payload = (
        b'{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"a\\qb"},"logprobs":null,"finish_reason":null}]}'
    )
    with pytest.raises(ValueError):
        json.loads(payload)
    with pytest.raises(ValueError):
        _text_chunk(payload)
