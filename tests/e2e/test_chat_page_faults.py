"""The chat page when things break: the model server or the site process dies mid-reply."""

import pytest

from tests.e2e.page_helpers import (
    conversation_id,
    norm,
    reply_status,
    reply_text,
    saved_reply,
    send,
    wait_reply_status,
    wait_reply_words,
    words,
)
from tests.support.factories import unique_name
from tests.support.processes import InferenceServer, SiteServer, free_port
from tests.support.site_client import SiteClient

pytestmark = [pytest.mark.browser, pytest.mark.live]

PASSWORD = "a-Long-pass-phrase-9"


@pytest.fixture
def flaky_pair(tmp_path):
    """A site with its own slow inference server; a test may kill and restart either."""
    port = free_port()
    servers = [
        InferenceServer(tmp_path, engine="fake", port=port, FAKE_TOKENS_PER_SECOND=5).start()
    ]
    env = dict(
        INFERENCE_URLS=servers[0].url,
        INFERENCE_FIRST_TOKEN_TIMEOUT=10,
        INFERENCE_READ_TIMEOUT=3,
        CHAT_MESSAGES_PER_MINUTE=1000,
    )
    sites = [SiteServer(tmp_path, tmp_path / "var", **env).start()]

    def restart_inference():
        servers.append(
            InferenceServer(tmp_path, engine="fake", port=port, FAKE_TOKENS_PER_SECOND=5).start()
        )

    def restart_site():
        sites.append(
            SiteServer(tmp_path, tmp_path / "var", port=sites[0].port, **env).start(migrate=False)
        )

    yield sites, servers, restart_inference, restart_site
    for process in sites + servers:
        process.stop()


def test_process_deaths_show_errors_and_recover(flaky_pair, open_page, page_errors):
    """The inference server dies mid-reply: the error shows with Retry, and Retry works once
    it is back. Then the site itself restarts: the page says it is reconnecting, resumes."""
    sites, servers, restart_inference, restart_site = flaky_pair
    site = sites[0]
    client = SiteClient(site.url).signup(unique_name())
    page = open_page(site.url, client)
    page.goto("/")
    page.wait_for_selector("html[data-ready='1']")
    text = words(12, "k")  # 2.4 s at 5 tokens/s
    send(page, text)
    wait_reply_words(page, 2)
    servers[0].kill()
    error = page.locator(".msg-assistant .msg-error").last
    error.wait_for(state="visible", timeout=15000)
    assert norm(error.locator(".msg-error-text").inner_text())
    assert reply_status(page) in ("failed", "interrupted")
    partial = norm(reply_text(page))
    assert partial and text.startswith(partial)
    saved = saved_reply(client, conversation_id(page))
    assert saved["status"] in ("failed", "interrupted")
    restart_inference()
    page.locator(".msg-assistant .msg-error button", has_text="Retry").click()
    wait_reply_status(page, "complete", timeout=20000)
    assert norm(reply_text(page)) == text
    assert page.locator(".msg-assistant").count() == 1
    assert page.locator(".msg-error:visible").count() == 0

    # The site goes away: EventSource retries (CONNECTING) and the page says so.
    page_errors.allow(r"ERR_INCOMPLETE_CHUNKED_ENCODING|ERR_CONNECTION_REFUSED|ERR_EMPTY_RESPONSE")
    site.kill()
    page.wait_for_selector("#conn-status:text('Reconnecting')", timeout=10000)
    restart_site()
    page.wait_for_function(
        "() => document.querySelector('#conn-status').textContent === ''", timeout=15000
    )
    send(page, "after the restart")
    page.wait_for_function("() => document.querySelectorAll('.msg-assistant').length === 2")
    wait_reply_status(page, "complete", timeout=20000)
    assert norm(reply_text(page)) == "after the restart"
