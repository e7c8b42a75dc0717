"""What the browser tests do and read on the chat page."""

import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.support.site_client import SiteClient

pytestmark = [pytest.mark.browser, pytest.mark.live]

PASSWORD = "a-Long-pass-phrase-9"


def norm(text: str) -> str:
    return " ".join(text.split())


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i:04d}" for i in range(n))


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def reply_status(page) -> str | None:
    return page.evaluate(
        "() => { const m = [...document.querySelectorAll('.msg-assistant')].pop();"
        " return m ? m.dataset.status : null }"
    )


def wait_reply_status(page, status: str, timeout: float = 20000) -> None:
    try:
        page.wait_for_function(
            "s => { const m = [...document.querySelectorAll('.msg-assistant')].pop();"
            " return Boolean(m) && m.dataset.status === s }",
            arg=status,
            timeout=timeout,
        )
    except PlaywrightTimeout as timed_out:
        # what the page shows instead, so that a failure says which way it went
        shown = page.locator(".msg-assistant .msg-body").last
        text = shown.inner_text() if shown.count() else ""
        raise AssertionError(
            f"the last reply is {reply_status(page)!r}, not {status!r}, after"
            f" {timeout / 1000:g} s; it reads {text[:200]!r}"
        ) from timed_out


def reply_text(page) -> str:
    return page.locator(".msg-assistant .msg-body").last.inner_text()


def wait_reply_words(page, count: int, timeout: float = 15000) -> None:
    page.wait_for_function(
        "n => { const m = [...document.querySelectorAll('.msg-assistant .msg-body')].pop();"
        " return Boolean(m) && m.innerText.split(/\\s+/).filter(Boolean).length >= n }",
        arg=count,
        timeout=timeout,
    )


def conversation_id(page) -> str:
    match = re.search(r"/c/([0-9a-f-]{36})/", page.url)
    assert match, page.url
    return match.group(1)


def saved_reply(client: SiteClient, conv_id: str) -> dict:
    data = client.api("GET", f"/api/conversations/{conv_id}/").json()
    return [m for m in data["messages"] if m["role"] == "assistant"][-1]
