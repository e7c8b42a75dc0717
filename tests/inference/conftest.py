"""Fixtures of the inference server tests (no Django here)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from inference.settings import Settings


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "model: uses the real bundled model (loaded once per session; slower)"
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fake_settings(**overrides: Any) -> Settings:
    """Fake engine settings that ignore the caller's environment."""
    base: dict[str, Any] = {
        "engine": "fake", "fake_tokens_per_second": 0, "max_batch": 8, "max_queue": 64,
        "inference_api_key": "", "model": "", "model_name": "", "context_length": 0,
    }
    return Settings(**(base | overrides))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """A real uvicorn server for `app` in a thread (real sockets, real disconnects)."""

    def __init__(self, app: Any, ready: bool = False) -> None:
        """ready: entering also waits for /ready (the engine loads in the background)."""
        self.ready = ready
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        if self.ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while httpx.get(f"{self.url}/ready").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("server never became ready")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)


@pytest.fixture
def live_fake() -> Iterator[Any]:
    """Factory: `with live_fake(**settings) as server:` a fake-engine server on a free port."""
    from inference.app import create_app

    def make(**overrides: Any) -> LiveServer:
        return LiveServer(create_app(fake_settings(**overrides)), ready=True)

    return make


@pytest.fixture(scope="session")
def loaded_model() -> Any:
    """The bundled model, loaded once per session (the first run converts the GGUF once
    into the default MODEL_CACHE_DIR, ~20-60 s; later runs load in seconds)."""
    from inference.model_store import prepare_model

    return prepare_model(Settings(model="", dtype="auto", device="cpu"))


@pytest.fixture(scope="session")
def loaded_model_cuda() -> Any:
    """The bundled model on CUDA (DTYPE=auto: bfloat16 there)."""
    from inference.model_store import prepare_model

    return prepare_model(Settings(model="", dtype="auto", device="cuda"))


def model_settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {"engine": "transformers", "device": "cpu", "max_batch": 4,
                            "max_queue": 8, "inference_api_key": "", "model": "",
                            "model_name": "", "context_length": 0}
    return Settings(**(base | overrides))


@pytest.fixture(scope="session")
def live_model(loaded_model: Any) -> Iterator[LiveServer]:
    from inference.app import create_app
    from inference.hf_engine import TransformersEngine

    engine = TransformersEngine(model_settings(), loaded=loaded_model)
    with LiveServer(create_app(model_settings(), engine=engine)) as server:
        server.wait_ready()
        yield server


def sse_events(lines: Iterator[str]) -> Iterator[str]:
    """The `data:` payloads of an SSE body, in order."""
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: "):]


def run(coro: Any) -> Any:
    return asyncio.run(coro)
