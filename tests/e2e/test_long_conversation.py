"""A long conversation opens on its newest messages and loads the earlier ones as the reader
scrolls up, in order, each once."""

import pytest

from tests.support.factories import unique_name
from tests.support.processes import SiteServer
from tests.support.site_client import SiteClient

pytestmark = [pytest.mark.browser, pytest.mark.live]


@pytest.fixture
def paged_site(tmp_path, fake_inference):
    site = SiteServer(
        tmp_path,
        tmp_path / "var",
        INFERENCE_URLS=fake_inference.url,
        CHAT_MESSAGES_PAGE_SIZE=4,
        CHAT_MESSAGES_PER_MINUTE=1000,
    ).start()
    yield site
    site.stop()


def texts(page) -> list[str]:
    return page.eval_on_selector_all(".msg-user", "els => els.map(e => e.textContent.trim())")


def test_earlier_messages_load_above_as_the_reader_scrolls_up(paged_site, open_page):
    client = SiteClient(paged_site.url).signup(unique_name())
    conversation = client.new_conversation()
    for number in range(5):
        reply = client.send(conversation["id"], f"question{number}")["assistant_message"]
        client.wait_settled(conversation["id"], reply["id"])
    first_page = client.api("GET", f"/api/conversations/{conversation['id']}/").json()
    assert [m["content"] for m in first_page["messages"]][::2] == ["question3", "question4"]
    assert first_page["has_earlier"]

    page = open_page(paged_site.url, client)
    page.goto(f"/c/{conversation['id']}/")
    page.wait_for_selector("html[data-ready='1']")
    # Each page keeps the reader where they were; scrolling up to the button loads the next.
    for _ in range(5):
        if page.evaluate("() => document.querySelectorAll('.msg').length") == 10:
            break
        # The button is replaced as each page loads: scroll to whichever is there now.
        page.evaluate("() => document.querySelector('.load-earlier')?.scrollIntoView()")
        page.wait_for_timeout(500)
    page.wait_for_function("() => document.querySelectorAll('.msg').length === 10")
    assert page.locator(".load-earlier").count() == 0
    assert [text.split("‹")[0].strip() for text in texts(page)] == [
        f"question{n}" for n in range(5)
    ]
