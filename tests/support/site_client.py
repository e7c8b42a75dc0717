"""A signed-in user talking to the live site like the page does (cookies, CSRF, SSE)."""

import json
import time
from dataclasses import dataclass, field

import httpx

from tests.support.sse import parse_sse_block


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
            data={
                "username": username,
                "password1": password,
                "password2": password,
                "csrfmiddlewaretoken": self.csrf,
            },
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
        response = self.api(
            "POST", f"/api/conversations/{conversation_id}/messages/", {"content": content}
        )
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
        self.http = httpx.Client(
            base_url=client.base_url,
            cookies=client.http.cookies,
            timeout=httpx.Timeout(30, read=60),
        )
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
