"""Real processes for end-to-end tests: daphne serving the site, `python -m inference`, and
small HTTP/SSE clients that behave like the page does."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
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
        log = open(self.log_path, "ab")
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


class SiteServer:
    def __init__(self, log_dir: Path, var_dir: Path, *, port: int | None = None, **env):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = base_env(TOKENSTREAM_VAR_DIR=var_dir, DJANGO_DEBUG=0, **env)
        self.var_dir = var_dir
        self.process = Process(
            f"site-{self.port}",
            [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
             "tokenstream_site.asgi:application"],
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


@dataclass
class SseEvent:
    event: str
    id: str | None
    data: dict | str

    @property
    def json(self) -> dict:
        return self.data if isinstance(self.data, dict) else {}


def parse_sse_block(block: str) -> SseEvent | None:
    event, event_id, data_lines = "message", None, []
    for line in block.split("\n"):
        if line.startswith(":") or not line:
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "id":
            event_id = value
        elif name == "data":
            data_lines.append(value)
    if not data_lines and event == "message":
        return None
    raw = "\n".join(data_lines)
    try:
        data = json.loads(raw) if raw else ""
    except ValueError:
        data = raw
    return SseEvent(event, event_id, data)


@dataclass
class SiteClient:
    """A signed-in user talking to the site like the page does (cookies, CSRF, SSE)."""

    base_url: str
    http: httpx.Client = field(init=False)

    def __post_init__(self):
        self.http = httpx.Client(base_url=self.base_url, timeout=30, follow_redirects=False)

    @property
    def csrf(self) -> str:
        return self.http.cookies.get("csrftoken", "")

    def signup(self, username: str, password: str = "a-Long-pass-phrase-9") -> "SiteClient":
        self.http.get("/accounts/signup/")
        response = self.http.post(
            "/accounts/signup/",
            data={"username": username, "password1": password, "password2": password,
                  "csrfmiddlewaretoken": self.csrf},
        )
        assert response.status_code == 302, response.text[:2000]
        return self

    def api(self, method: str, path: str, payload=None, **kwargs) -> httpx.Response:
        headers = {"X-CSRFToken": self.csrf, "Referer": self.base_url + "/"}
        if payload is not None:
            kwargs["content"] = json.dumps(payload)
            headers["Content-Type"] = "application/json"
        return self.http.request(method, path, headers=headers, **kwargs)

    def new_conversation(self, **fields) -> dict:
        response = self.api("POST", "/api/conversations/", fields)
        assert response.status_code == 201, response.text
        return response.json()

    def send(self, conversation_id: str, content: str) -> dict:
        response = self.api("POST", f"/api/conversations/{conversation_id}/messages/",
                            {"content": content})
        assert response.status_code == 202, response.text
        return response.json()

    def message(self, conversation_id: str, message_id: str) -> dict:
        """One message as the API shows it in its conversation."""
        messages = self.api("GET", f"/api/conversations/{conversation_id}/").json()["messages"]
        return next(m for m in messages if m["id"] == message_id)

    def wait_settled(self, conversation_id: str, message_id: str, timeout: float = 30) -> dict:
        """The message once it is no longer streaming; fails if it stays streaming."""
        deadline = time.monotonic() + timeout
        while (saved := self.message(conversation_id, message_id))["status"] == "streaming":
            assert time.monotonic() < deadline, "reply stuck streaming"
            time.sleep(0.2)
        return saved

    def events(self, conversation_id: str, last_event_id: str | None = None):
        """An open SSE stream; iterate it for SseEvent objects."""
        return SseStream(self, conversation_id, last_event_id)


class SseStream:
    def __init__(self, client: SiteClient, conversation_id: str, last_event_id: str | None):
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self.http = httpx.Client(base_url=client.base_url, cookies=client.http.cookies,
                                 timeout=httpx.Timeout(30, read=60))
        self.context = self.http.stream(
            "GET", f"/events/conversations/{conversation_id}/", headers=headers
        )
        self.response = self.context.__enter__()
        self.last_id: str | None = last_event_id
        self._buffer = ""
        self._chunks = self.response.iter_text()

    def __iter__(self):
        while True:
            while "\n\n" not in self._buffer:
                self._buffer += next(self._chunks)
            block, self._buffer = self._buffer.split("\n\n", 1)
            event = parse_sse_block(block.replace("\r\n", "\n"))
            if event is None:
                continue
            if event.id and event.id != "error":
                self.last_id = event.id
            yield event

    def close(self) -> None:
        try:
            self.context.__exit__(None, None, None)
        finally:
            self.http.close()


def collect_reply(stream: SseStream, message_id: str, *, stop_after_tokens: int | None = None):
    """Read a reply's events until it ends; returns (tokens in order, end event)."""
    tokens: list[dict] = []
    for event in stream:
        data = event.json
        if data.get("message_id") != message_id:
            continue
        if event.event == "token":
            tokens.append(data)
            if stop_after_tokens is not None and len(tokens) >= stop_after_tokens:
                return tokens, None
        elif event.event in ("message.end", "message.error"):
            return tokens, event
    raise AssertionError("stream ended")
