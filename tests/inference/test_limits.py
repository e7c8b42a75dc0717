"""What one request may cost the server before it is refused: a body over the ceiling is a
413 and is never parsed, the prompt is tokenised off the event loop, and a non-streaming
request whose client left gives its slot back."""

from __future__ import annotations

import threading
from typing import Any

import httpx
from fastapi.testclient import TestClient

from inference.app import create_app
from inference.fake_engine import FakeEngine
from tests.support.inference_app import fake_settings

BODY = {"model": "fake", "messages": [{"role": "user", "content": "alpha beta gamma"}]}


class RecordingEngine(FakeEngine):
    """The fake engine, noting which thread tokenised each prompt."""

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.encoded_on: list[int] = []

    def _encode(self, messages):  # type: ignore[override]
        self.encoded_on.append(threading.get_ident())
        return super()._encode(messages)


def _ready(client: TestClient) -> TestClient:
    for _ in range(200):
        if client.get("/ready").status_code == 200:
            return client
        threading.Event().wait(0.02)
    raise AssertionError("never ready")


def test_a_body_over_the_ceiling_is_a_413_and_reaches_no_engine() -> None:
    settings = fake_settings(max_request_bytes=2048)
    engine = RecordingEngine(settings)
    with TestClient(create_app(settings, engine=engine)) as client:
        _ready(client)
        before = len(engine.encoded_on)
        big = BODY | {"messages": [{"role": "user", "content": "x" * 5000}]}
        declared = client.post("/v1/chat/completions", json=big)
        chunked = client.post(
            "/v1/chat/completions",
            content=iter([b'{"messages": "', b"x" * 4000]),
            headers={"content-type": "application/json"},
        )
        small = client.post("/v1/chat/completions", json=BODY)
    assert declared.status_code == chunked.status_code == 413
    assert declared.json()["error"]["code"] == "request_too_large"
    assert small.status_code == 200
    assert len(engine.encoded_on) == before + 1  # the small request only


def test_prompts_are_tokenised_off_the_event_loop() -> None:
    settings = fake_settings()
    engine = RecordingEngine(settings)
    with TestClient(create_app(settings, engine=engine)) as client:
        _ready(client)
        loop_thread = client.portal.call(lambda: threading.get_ident())
        assert client.post("/v1/chat/completions", json=BODY).status_code == 200
    assert engine.encoded_on[-1] != loop_thread


def test_a_non_streaming_client_that_leaves_gives_its_slot_back(live_fake: Any) -> None:
    with live_fake(max_batch=1, max_queue=0, fake_tokens_per_second=5) as server:
        long = BODY | {"messages": [{"role": "user", "content": "word " * 400}]}
        try:
            httpx.post(f"{server.url}/v1/chat/completions", json=long, timeout=0.5)
        except httpx.ReadTimeout:
            pass  # the client gave up and closed its connection
        # With the slot back, the one running place is free again for the next request.
        answer = None
        for _ in range(40):
            answer = httpx.post(
                f"{server.url}/v1/chat/completions", json=BODY | {"max_tokens": 2}, timeout=10
            )
            if answer.status_code == 200:
                break
            threading.Event().wait(0.1)
        assert answer is not None and answer.status_code == 200
