"""The chat page in a real browser (Debian's Chromium) against daphne + `python -m inference`."""

import re
import time

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
from tests.support.site_client import SiteClient

pytestmark = [pytest.mark.browser, pytest.mark.live]

PASSWORD = "a-Long-pass-phrase-9"


def test_sign_in(open_page, live_site):
    name = unique_name("signin")
    SiteClient(live_site.url).signup(name, PASSWORD)
    page = open_page(live_site.url)
    page.goto("/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", name)
    page.fill("#id_password", "wrong-password")
    page.click("button[type=submit]")
    assert page.locator(".form-error").is_visible()
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("html[data-ready='1']")
    assert page.url.rstrip("/") == live_site.url
    assert page.locator(".user-name").inner_text() == name
    assert page.locator("#prompt").is_visible()


def test_send_streams_markdown(chat_page):
    page, client = chat_page
    assert page.locator("#send").is_disabled()
    page.fill("#prompt", "   ")
    assert page.locator("#send").is_disabled()
    # Shift+Enter makes a new line instead of sending.
    page.fill("#prompt", "first line")
    page.press("#prompt", "Shift+Enter")
    assert page.input_value("#prompt") == "first line\n"
    assert page.locator(".msg-user").count() == 0
    text = (
        "Here is **bold** text and code:\n\n```python\ndef hello():\n    return 'hi'\n```\n\n"
        + words(40)
    )
    page.fill("#prompt", text)
    assert page.locator("#send").is_enabled()
    started = time.monotonic()
    page.press("#prompt", "Enter")
    # The question shows at once, and the URL becomes the new conversation's.
    page.wait_for_selector(".msg-user .bubble", timeout=2000)
    assert page.locator(".msg-user .bubble").inner_text() == text
    assert page.input_value("#prompt") == ""
    page.wait_for_url(re.compile(r"/c/[0-9a-f-]{36}/$"), timeout=5000)
    # The first token is painted while the reply is still streaming.
    page.wait_for_function(
        "() => { const m = [...document.querySelectorAll('.msg-assistant')].pop();"
        " return Boolean(m) && m.dataset.status === 'streaming'"
        " && m.querySelector('.msg-body').innerText.includes('Here') }",
        timeout=5000,
    )
    first_paint = time.monotonic() - started
    assert first_paint < 3, first_paint
    assert page.locator("#stop").is_visible()
    assert page.locator(".msg-assistant .msg-body[aria-busy=true]").count() == 1
    wait_reply_status(page, "complete")
    body = page.locator(".msg-assistant .msg-body").last
    assert body.locator("strong").inner_text() == "bold"
    code = body.locator(".code-block pre code.hljs.language-python")
    assert "def hello():" in code.inner_text()
    assert code.locator("span.hljs-keyword").count() >= 1
    assert body.locator(".code-block button.copy-code").count() == 1
    meta = page.locator(".msg-assistant .msg-meta").last.inner_text()
    assert "first token" in meta and "tok/s" in meta, meta
    assert page.locator(".msg-assistant .msg-body[aria-busy]").count() == 0
    assert page.locator("#messages").get_attribute("aria-live") == "polite"
    # The conversation is in the list under its new title, and the page agrees with the API.
    conv_id = conversation_id(page)
    page.wait_for_selector(f"#conv-list li[data-id='{conv_id}'].current")
    saved = saved_reply(client, conv_id)
    assert saved["status"] == "complete"
    assert norm(page.locator(".msg-assistant .md-live, .msg-assistant .msg-body").last.inner_text())
    assert norm(saved["content"]).endswith(words(40))
    assert page.locator("#regenerate, .msg-assistant .action.regenerate").last.is_visible()


def test_reload_mid_reply_every_token_once(chat_page):
    page, client = chat_page
    text = words(160)  # 3.2 s at 50 tokens/s
    send(page, text)
    page.wait_for_url(re.compile(r"/c/[0-9a-f-]{36}/$"))
    wait_reply_words(page, 60)
    conv_id = conversation_id(page)
    page.reload()
    page.wait_for_selector("html[data-ready='1']")
    # The saved part is on the page straight from the server, and the rest comes live.
    partial = norm(reply_text(page))
    assert reply_status(page) == "streaming", "the reply ended before the reload finished"
    assert len(partial.split()) >= 10 and text.startswith(partial)
    wait_reply_status(page, "complete")
    rendered = norm(reply_text(page))
    saved = saved_reply(client, conv_id)
    assert norm(saved["content"]) == text
    assert rendered == text


def test_stop(chat_page):
    page, client = chat_page
    text = words(300)
    send(page, text)
    wait_reply_words(page, 10)
    page.click("#stop")
    wait_reply_status(page, "cancelled", timeout=10000)
    stopped = reply_text(page)
    time.sleep(1)
    assert reply_text(page) == stopped
    assert len(norm(stopped).split()) < 300
    saved = saved_reply(client, conversation_id(page))
    assert saved["status"] == "cancelled"
    assert norm(saved["content"]) == norm(stopped)
    assert page.locator("#stop").is_hidden()
    assert "stopped" in page.locator(".msg-assistant .msg-meta").last.inner_text()


def test_model_output_runs_nothing(chat_page):
    page, client = chat_page
    remote = []
    page.on("request", lambda r: r.url.startswith("http://example.") and remote.append(r.url))
    text = (
        'look <img src=x onerror="window.__xss=1"> and <script>window.__xss=1</script> '
        "[click](javascript:window.__xss=1) ![pic](http://example.com/a.png) "
        '<iframe src="http://example.org/"></iframe> [ok](https://example.net/page)'
    )
    send(page, text)
    wait_reply_status(page, "complete")
    reply = page.locator(".msg-assistant").last
    assert page.evaluate("() => window.__xss") is None
    assert reply.locator("img, script, iframe, [onerror], [src]").count() == 0
    assert page.locator("#messages img, #messages script").count() == 0
    # Raw HTML is shown as the text it is.
    assert '<img src=x onerror="window.__xss=1">' in reply_text(page)
    hrefs = reply.locator(".msg-body a").evaluate_all(
        "links => links.map(a => [a.getAttribute('href'), a.target, a.rel])"
    )
    assert ["https://example.net/page", "_blank", "noopener noreferrer nofollow"] in hrefs
    assert all(not (href or "").lower().startswith("javascript") for href, _, _ in hrefs)
    page.locator(".msg-assistant .msg-body a", has_text="click").click()
    time.sleep(0.3)
    assert page.evaluate("() => window.__xss") is None
    assert remote == []


def test_conversation_list_rename_search_delete(chat_page, page_errors):
    page, client = chat_page
    other = client.new_conversation(title="Zebra facts")
    client.send(other["id"], "zebras have stripes")
    send(page, "apples are red")
    wait_reply_status(page, "complete")
    conv_id = conversation_id(page)
    page.wait_for_selector(f"#conv-list li[data-id='{conv_id}']")
    page.reload()
    page.wait_for_selector("html[data-ready='1']")
    item = page.locator(f"#conv-list li[data-id='{conv_id}']")
    item.locator(".conv-rename").click()
    page.fill(".conv-rename-input", "Fruit talk")
    page.press(".conv-rename-input", "Enter")
    page.wait_for_selector(f"#conv-list li[data-id='{conv_id}'] .conv-link:text('Fruit talk')")
    assert page.locator("#chat-title").inner_text() == "Fruit talk"
    # Search finds message text, not only titles.
    page.fill("#search", "stripes")
    page.wait_for_function("() => document.querySelectorAll('#conv-list li').length === 1")
    assert page.locator("#conv-list li").get_attribute("data-id") == other["id"]
    page.fill("#search", "")
    page.wait_for_function("() => document.querySelectorAll('#conv-list li').length === 2")
    # Open the other conversation from the list, then come back with Back.
    page.locator(f"#conv-list li[data-id='{other['id']}'] .conv-link").click()
    page.wait_for_url(f"**/c/{other['id']}/")
    page.wait_for_selector(".msg-user .bubble:text('zebras have stripes')")
    page.go_back()
    page.wait_for_selector(".msg-user .bubble:text('apples are red')")
    # Delete the open one: the page goes to a new chat.
    item = page.locator(f"#conv-list li[data-id='{conv_id}']")
    item.locator(".conv-delete").click()
    page.click("#confirm-delete-button")
    page.wait_for_selector(f"#conv-list li[data-id='{conv_id}']", state="detached")
    assert page.locator("#chat-title").inner_text() == "New chat"
    assert client.api("GET", f"/api/conversations/{conv_id}/").status_code == 404


def test_settings_regenerate_and_edit(chat_page):
    page, client = chat_page
    send(page, "one two three")
    wait_reply_status(page, "complete")
    conv_id = conversation_id(page)
    page.click("#settings-toggle")
    page.wait_for_selector("#set-model option[value='fake']", state="attached")
    page.fill("#set-system", "Be brief.")
    page.fill("#set-temperature", "0.3")
    page.fill("#set-max-tokens", "2")
    page.click("#settings-save")
    page.wait_for_selector("#settings-status:text('Saved.')")
    saved = client.api("GET", f"/api/conversations/{conv_id}/").json()
    assert (saved["system_prompt"], saved["temperature"], saved["max_tokens"]) == (
        "Be brief.",
        0.3,
        2,
    )
    page.click("#settings-cancel")
    # Regenerate with max_tokens=2: the new reply replaces the old one.
    page.locator(".msg-assistant .action.regenerate").last.click()
    page.wait_for_function(
        "() => { const m = [...document.querySelectorAll('.msg-assistant')];"
        " return m.length === 1 && m[0].dataset.status === 'complete'"
        " && m[0].querySelector('.msg-body').innerText.trim() === 'one two' }"
    )
    assert "token limit" in page.locator(".msg-assistant .msg-meta").inner_text()
    # Edit & resend the last question. A two-token reply can end on the page before the
    # regenerate request's own answer is in, and until then the page takes no edit (as a
    # user would, click again once it is idle).
    edit = page.locator(".msg-user .action.edit")
    for _ in range(10):
        edit.click()
        if page.locator(".edit-form textarea").count():
            break
        page.wait_for_timeout(200)
    page.fill(".edit-form textarea", "four five six")
    page.press(".edit-form textarea", "Enter")
    page.wait_for_function(
        "() => { const m = [...document.querySelectorAll('.msg-assistant')];"
        " return m.length === 1 && m[0].dataset.status === 'complete'"
        " && m[0].querySelector('.msg-body').innerText.trim() === 'four five' }"
    )
    assert page.locator(".msg-user .bubble").all_inner_texts() == ["four five six"]


def test_too_deeply_nested_markdown_is_shown_as_text(chat_page):
    """3,000 nested `>` overflow the Markdown parser's stack: that one message is shown as
    the text it is, and the messages after it still render, live and after a reload."""
    page, client = chat_page
    deep = ">" * 3000 + " deep <b>end</b>"
    send(page, deep)
    wait_reply_status(page, "complete")
    send(page, "after **bold**")
    page.wait_for_function("() => document.querySelectorAll('.msg-assistant').length === 2")
    wait_reply_status(page, "complete")
    for reload in (False, True):
        if reload:
            page.reload()
            page.wait_for_selector("html[data-ready='1']")
        replies = page.locator(".msg-assistant .msg-body")
        assert replies.count() == 2
        assert norm(replies.nth(0).inner_text()) == deep
        assert replies.nth(0).locator("b, blockquote").count() == 0
        assert replies.nth(1).locator("strong").inner_text() == "bold"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_layouts_and_no_sideways_scroll(
    open_page, live_site, make_site_user, screenshot_dir, scheme
):
    client = make_site_user()
    conv = client.new_conversation(title="Layout check")
    long_word = "x" * 300
    client.send(
        conv["id"],
        f"A reply with a {long_word} long word, a table and code:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "```js\nconst veryLongLine = '" + "y" * 200 + "';\nconsole.log(veryLongLine);\n```\n\n"
        "- a list item\n- another item with `inline code`\n\nThe end.",
    )
    for name, viewport in (("desktop", (1280, 800)), ("phone", (390, 844))):
        page = open_page(
            live_site.url,
            client,
            viewport={"width": viewport[0], "height": viewport[1]},
            color_scheme=scheme,
        )
        page.goto(f"/c/{conv['id']}/")
        page.wait_for_selector("html[data-ready='1']")
        wait_reply_status(page, "complete")
        page.wait_for_selector(f"#conv-list li[data-id='{conv['id']}']", state="attached")
        page.screenshot(path=str(screenshot_dir / f"{name}-{scheme}.png"))
        sideways = page.evaluate(
            "() => [document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]"
        )
        assert sideways[0] <= sideways[1], sideways
        if name == "phone":
            assert page.locator("#sidebar").is_hidden()
            page.click("#sidebar-toggle")
            page.wait_for_selector("#sidebar", state="visible")
            page.wait_for_timeout(300)
            page.screenshot(path=str(screenshot_dir / f"{name}-{scheme}-list.png"))
            page.keyboard.press("Escape")
            page.wait_for_selector("#sidebar", state="hidden")
            sideways = page.evaluate(
                "() => [document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]"
            )
            assert sideways[0] <= sideways[1], sideways
        else:
            page.click("#settings-toggle")
            page.screenshot(path=str(screenshot_dir / f"{name}-{scheme}-settings.png"))
            page.goto("/")
            page.wait_for_selector("html[data-ready='1']")
            page.screenshot(path=str(screenshot_dir / f"{name}-{scheme}-empty.png"))
    login = open_page(live_site.url, color_scheme=scheme, viewport={"width": 390, "height": 844})
    login.goto("/accounts/login/")
    login.screenshot(path=str(screenshot_dir / f"login-phone-{scheme}.png"))


def test_api_error_is_shown(chat_page, page_errors):
    page, client = chat_page
    page_errors.allow(r"status of 503")
    page.route(
        "**/api/conversations/",
        lambda route: (
            route.fulfill(
                status=503,
                content_type="application/json",
                body='{"error": {"message": "The model server is overloaded, try again.", "status": 503}}',
            )
            if route.request.method == "POST"
            else route.continue_()
        ),
    )
    send(page, "hello")
    notice = page.locator("#notice")
    notice.wait_for(state="visible")
    assert "overloaded" in notice.inner_text()
    # The text is given back to retype or resend, and no ghost message stays.
    assert page.input_value("#prompt") == "hello"
    assert page.locator(".msg-user").count() == 0


def test_autoscroll_follows_but_lets_the_user_scroll_up(chat_page):
    page, client = chat_page
    page.set_viewport_size({"width": 1000, "height": 600})
    text = "\n\n".join(words(4, f"p{i}x") for i in range(60))  # 240 tokens, 60 paragraphs
    send(page, text)
    wait_reply_words(page, 60)
    at_bottom = (
        "() => { const s = document.querySelector('#messages-scroll');"
        " return s.scrollHeight - s.scrollTop - s.clientHeight < 30 }"
    )
    assert page.evaluate(at_bottom), "the stream is not followed"
    page.mouse.move(500, 300)
    page.mouse.wheel(0, -400)
    page.wait_for_selector("#jump-latest", state="visible")
    top = page.evaluate("() => document.querySelector('#messages-scroll').scrollTop")
    page.wait_for_timeout(700)
    assert reply_status(page) == "streaming"
    assert page.evaluate("() => document.querySelector('#messages-scroll').scrollTop") == top
    page.click("#jump-latest")
    page.wait_for_function(at_bottom)
    wait_reply_status(page, "complete")
    assert page.evaluate(at_bottom)
    assert page.locator("#jump-latest").is_hidden()
