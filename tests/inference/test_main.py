"""`python -m inference`: its command line, and the real process serving and stopping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference.__main__ import build_parser, load_settings
from inference.settings import Settings
from tests.support.processes import free_port
from tests.support.sse import sse_data

ROOT = Path(__file__).resolve().parents[2]
TEXT = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
BODY = {"model": "fake", "messages": [{"role": "user", "content": TEXT}], "stream": True}


def _wait(cond: Any, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.02)


def test_help_lists_every_setting() -> None:
    text = build_parser().format_help()
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in text and name.upper() in text


def test_cli_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "9100")
    monkeypatch.setenv("MAX_BATCH", "3")
    settings = load_settings(["--port", "9200", "--engine", "fake"])
    assert (settings.port, settings.max_batch, settings.engine) == (9200, 3, "fake")
    assert Settings().host == "127.0.0.1"


def test_python_m_inference_streams_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = os.environ | {
        "ENGINE": "fake",
        "PORT": str(port),
        "FAKE_TOKENS_PER_SECOND": "0",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "inference"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(lambda: _ok(f"{url}/ready"), timeout=30)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=BODY, timeout=10) as r:
            data = list(sse_data(r.iter_lines()))
        assert data[-1] == "[DONE]"
        assert (
            "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-1])
            == TEXT
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert proc.stdout is not None
        assert b"Application shutdown complete" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
