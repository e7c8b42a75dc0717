"""The inference app served for tests and benchmarks in this process: settings that ignore
the caller's environment, a real uvicorn server in a thread (real sockets, real
disconnects), and bare sequences for the sampler's unit tests. No Django here."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence as Ids
from typing import Any

import httpx
import uvicorn

from inference.sampling_params import SamplingParams
from inference.scheduler import Sequence
from inference.settings import Settings
from tests.support.processes import free_port


def fake_settings(**overrides: Any) -> Settings:
    """Fake engine settings that ignore the caller's environment."""
    base: dict[str, Any] = {
        "engine": "fake",
        "fake_tokens_per_second": 0,
        "max_batch": 8,
        "max_queue": 64,
        "inference_api_key": "",
        "model": "",
        "model_name": "",
        "context_length": 0,
    }
    return Settings(**(base | overrides))


def model_settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "engine": "transformers",
        "device": "cpu",
        "max_batch": 4,
        "max_queue": 8,
        "inference_api_key": "",
        "model": "",
        "model_name": "",
        "context_length": 0,
    }
    return Settings(**(base | overrides))


class LiveServer:
    """A real uvicorn server for `app` in a thread (real sockets, real disconnects)."""

    def __init__(self, app: Any, ready: bool = False) -> None:
        """ready: entering also waits for /ready (the engine loads in the background)."""
        self.ready = ready
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=2
        )
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


class NoText:
    """A detokenizer for tests where only token ids matter."""

    def push(self, token_id: int) -> str:
        return ""

    def flush(self) -> str:
        return ""

    def token_bytes(self, token_id: int) -> bytes:
        return b""


def bare_sequence(prompt: Ids[int], generated: Ids[int] = (), **params: Any) -> Sequence:
    """A sequence as the sampler sees it: prompt, tokens generated so far, its parameters."""
    seq = Sequence(
        list(prompt), SamplingParams(**({"max_tokens": 50} | params)), NoText(), asyncio.Queue()
    )
    seq.generated = list(generated)
    return seq


def greedy_sequence(loaded: Any, prompt: str, tokens: int) -> Sequence:
    """One user message as the real model's backend takes it: exactly `tokens` greedy tokens
    (no end at EOS), its text detokenized, driven by the test rather than a scheduler."""
    from inference.chat_encoder import encode_chat
    from inference.engine import Message
    from inference.textstream import IncrementalDetokenizer

    return Sequence(
        encode_chat(loaded.tokenizer, [Message("user", prompt)]),
        SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True),
        IncrementalDetokenizer(loaded.tokenizer),
        asyncio.Queue(),
    )
