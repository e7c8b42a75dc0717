"""Real processes for live tests and benchmarks: daphne serving the site and
`python -m inference`, each on a free port with its output kept in a log file."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_http(url: str, *, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code < 500:
                return
            last = response.status_code
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout}s (last: {last})")


class Process:
    """A child process with its output kept in a log file for failure reports."""

    def __init__(self, name: str, args: list[str], env: dict, log_dir: Path):
        self.name = name
        self.args = args
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.popen: subprocess.Popen | None = None

    def start(self) -> "Process":
        # Open for the child's lifetime; Popen keeps its own descriptor.
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.popen = subprocess.Popen(
            self.args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        return self

    def kill(self) -> None:
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def base_env(**overrides) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update({"PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "tokenstream_site.settings"})
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def run_bench(module: str, *argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m bench.<module> argv…` from the repository root; fails the test unless it
    exits 0, and gives back what it printed."""
    result = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *argv],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


class InferenceServer:
    def __init__(self, log_dir: Path, *, engine: str = "fake", port: int | None = None, **env):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = Process(
            f"inference-{self.port}",
            [PYTHON, "-m", "inference"],
            base_env(ENGINE=engine, PORT=self.port, HOST="127.0.0.1", **env),
            log_dir,
        )

    def start(self, timeout: float = 120) -> "InferenceServer":
        self.process.start()
        wait_for_http(f"{self.url}/health", timeout=timeout, process=self.process.popen)
        deadline = time.monotonic() + timeout
        while httpx.get(f"{self.url}/ready", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError("inference server never became ready")
            time.sleep(0.2)
        return self

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop()


@contextlib.contextmanager
def slow_reader(log_dir: Path, words_per_second: float, tokens_per_second: float = 200):
    """A started fake-engine server that reads prompts at `words_per_second` (in steps of
    64 words, reporting its progress), for the tests of a long paste."""
    server = InferenceServer(
        log_dir,
        engine="fake",
        FAKE_TOKENS_PER_SECOND=tokens_per_second,
        FAKE_PREFILL_TOKENS_PER_SECOND=words_per_second,
    ).start()
    try:
        yield server
    finally:
        server.stop()


# Every test and benchmark signs up from 127.0.0.1, and some open hundreds of streams: the
# per-client limits are set out of reach unless a test sets them itself.
LIVE_LIMITS = {
    "TOKENSTREAM_SIGNUPS_PER_HOUR": 100000,
    "CHAT_CONVERSATIONS_PER_MINUTE": 100000,
    "EVENTS_MAX_STREAMS_PER_USER": 100000,
}


class SiteServer:
    def __init__(self, log_dir: Path, var_dir: Path, *, port: int | None = None, **env):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = base_env(
            TOKENSTREAM_VAR_DIR=var_dir,
            DJANGO_DEBUG=0,
            SITE_HOST="127.0.0.1",
            SITE_PORT=self.port,
            **{**LIVE_LIMITS, **env},
        )
        self.var_dir = var_dir
        self.process = Process(
            f"site-{self.port}",
            [PYTHON, "-m", "tokenstream_site.serve"],
            self.env,
            log_dir,
        )

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [PYTHON, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def start(self, migrate: bool = True) -> "SiteServer":
        if migrate:
            self.manage("migrate", "--noinput")
        self.process.start()
        wait_for_http(f"{self.url}/accounts/login/", timeout=60, process=self.process.popen)
        return self

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop()
