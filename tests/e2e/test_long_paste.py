"""A long paste on a phone: while the server reads it, the reply shows how far it got, then
the text replaces the progress."""

import time

import pytest

from tests.e2e.page_helpers import norm, reply_text, send, wait_reply_status, words
from tests.support.factories import unique_name
from tests.support.processes import SiteServer, slow_reader
from tests.support.site_client import SiteClient

pytestmark = [pytest.mark.browser, pytest.mark.live]

PASTE_WORDS = 800  # 4 s of prefill at 200 words a second, in steps of 64


@pytest.fixture
def slow_site(tmp_path):
    with slow_reader(tmp_path, words_per_second=200, tokens_per_second=50) as inference:
        site = SiteServer(
            tmp_path, tmp_path / "var", INFERENCE_URLS=inference.url, CHAT_DEFAULT_MAX_TOKENS=5
        ).start()
        yield site
        site.stop()


# read in one go: the progress may give way to the reply's text between two separate reads
READING = """() => {
  const r = [...document.querySelectorAll('.msg-assistant .reading')].pop();
  if (!r || r.hidden) return null;
  const box = r.getBoundingClientRect();
  return {text: r.innerText, value: r.getAttribute('aria-valuenow'),
          left: box.left, right: box.right};
}"""


def reading(page) -> dict | None:
    """The last reply's progress as shown (its words, aria-valuenow, edges); None: none."""
    shown = page.evaluate(READING)
    return shown and shown | {"text": norm(shown["text"])}


def test_a_long_paste_shows_how_much_of_it_the_server_has_read(slow_site, open_page):
    client = SiteClient(slow_site.url).signup(unique_name())
    page = open_page(slow_site.url, client, viewport={"width": 390, "height": 844})
    page.goto("/")
    page.wait_for_selector("html[data-ready='1']")
    paste = words(PASTE_WORDS, "p")
    send(page, paste)
    seen: list[int] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not norm(reply_text(page)):
        shown = reading(page)
        if shown:
            percent = int(shown["value"])
            assert shown["text"] == f"Reading your message… {percent}%"
            assert 0 <= shown["left"] < shown["right"] <= 390  # on the phone's screen
            if not seen or seen[-1] != percent:
                seen.append(percent)
        time.sleep(0.05)
    assert len(seen) >= 3, seen  # several steps' progress, as the server read the paste
    assert seen == sorted(seen) and seen[0] > 0 and seen[-1] < 100
    wait_reply_status(page, "complete")
    assert norm(reply_text(page)) == " ".join(paste.split()[:5])
    assert reading(page) is None
