"""The app over real sockets (uvicorn in a thread): real clients, disconnects, back-pressure."""

from __future__ import annotations

import re
import time
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest

from tests.support.sse import sse_data

TEXT = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
BODY = {"model": "fake", "messages": [{"role": "user", "content": TEXT}], "stream": True}


def _gauge(url: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
    assert m, name
    return float(m.group(1))


def _wait(cond: Any, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.02)


def test_openai_client_consumes_the_stream(live_fake: Any) -> None:
    with live_fake(inference_api_key="k") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0)
        stream = client.chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": TEXT}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == TEXT
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
        reply = client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": TEXT}]
        )
        assert reply.choices[0].message.content == TEXT
        assert [m.id for m in client.models.list()] == ["fake"]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}]
            )


def test_disconnect_frees_the_slot(live_fake: Any) -> None:
    with live_fake(max_batch=1, max_queue=0, fake_tokens_per_second=20) as server:
        long = BODY | {"messages": [{"role": "user", "content": TEXT * 20}]}
        with httpx.Client(base_url=server.url, timeout=10) as c:
            with c.stream("POST", "/v1/chat/completions", json=long) as r:
                assert r.status_code == 200
                # keep the iterator: a discarded one is finalized at once, and closing it
                # closes the connection, i.e. disconnects before the check below
                lines = r.iter_lines()
                next(lines)
                assert _gauge(server.url, "inference_running_sequences") == 1
            # the client went away: the sequence leaves at the next step
            _wait(lambda: _gauge(server.url, "inference_running_sequences") == 0)
            r = c.post("/v1/chat/completions", json=BODY | {"stream": False, "max_tokens": 2})
            assert r.status_code == 200
        assert 'outcome="disconnected"' in httpx.get(f"{server.url}/metrics").text


def test_503_with_retry_after_when_full(live_fake: Any) -> None:
    with live_fake(max_batch=1, max_queue=1, fake_tokens_per_second=10) as server:
        with ExitStack() as stack:
            c = stack.enter_context(httpx.Client(base_url=server.url, timeout=10))
            for _ in range(2):  # one running, one waiting
                stack.enter_context(c.stream("POST", "/v1/chat/completions", json=BODY))
            _wait(lambda: _gauge(server.url, "inference_queue_depth") == 1)
            r = c.post("/v1/chat/completions", json=BODY)
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "server_overloaded"


def test_concurrent_streams_interleave(live_fake: Any) -> None:
    with (
        live_fake(fake_tokens_per_second=50) as server,
        httpx.Client(base_url=server.url, timeout=10) as c,
    ):
        with c.stream("POST", "/v1/chat/completions", json=BODY) as first:
            lines = first.iter_lines()
            next(lines)
            second = c.post("/v1/chat/completions", json=BODY | {"stream": False, "max_tokens": 2})
            assert second.status_code == 200
            rest = list(sse_data(lines))
            assert rest[-1] == "[DONE]" and len(rest) > 3  # the first was still streaming
