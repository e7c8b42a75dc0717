"""Branches, presets, feedback, share links, math and shortcuts in Debian's Chromium,
against daphne and `python -m inference` (fake engine, 50 tokens/s)."""

import re
import time

import pytest

from tests.e2e.page_helpers import (
    conversation_id,
    norm,
    reply_text,
    send,
    wait_reply_status,
    wait_reply_words,
    words,
)
from tests.support.factories import unique_name
from tests.support.processes import SiteServer
from tests.support.site_client import SiteClient

pytestmark = [pytest.mark.browser, pytest.mark.live]


def three_turns(client: SiteClient, title="Three turns") -> dict:
    conv = client.new_conversation(title=title)
    for text in ("first question", "second question", "third question"):
        sent = client.send(conv["id"], text)
        client.wait_settled(conv["id"], sent["assistant_message"]["id"])
    return conv


def open_conversation(page, conv_id: str) -> None:
    page.goto(f"/c/{conv_id}/")
    page.wait_for_selector("html[data-ready='1']")


def bubbles(page) -> list[str]:
    return page.locator(".msg-user .bubble").all_inner_texts()


def wait_replies(page, count: int) -> None:
    """A sent message's reply is on the page (before it, the last reply is the previous one)."""
    page.wait_for_function(
        "n => document.querySelectorAll('.msg-assistant').length === n", arg=count
    )


def first_nav(page):
    return page.locator(".msg-user").first.locator(".branch-nav")


def test_edit_the_first_question_flip_between_branches_and_reload_mid_reply(
    open_page, live_site, make_site_user
):
    client = make_site_user()
    conv = three_turns(client)
    page = open_page(live_site.url, client)
    open_conversation(page, conv["id"])
    assert first_nav(page).is_hidden()  # one version: no arrows
    text = words(300, "e")  # 6 s at 50 tokens/s
    page.locator(".msg-user .action.edit").first.click()
    page.fill(".edit-form textarea", text)
    page.press(".edit-form textarea", "Enter")
    page.wait_for_function("() => document.querySelectorAll('.msg-user').length === 1")
    assert first_nav(page).locator(".branch-count").inner_text() == "2/2"
    wait_reply_words(page, 20)

    # Back to the first version while the new reply streams: the old three turns, at once.
    first_nav(page).locator(".prev").click()
    page.wait_for_function("() => document.querySelectorAll('.msg-user').length === 3")
    assert bubbles(page) == ["first question", "second question", "third question"]
    assert first_nav(page).locator(".branch-count").inner_text() == "1/2"
    assert page.locator("#stop").is_visible()  # the reply elsewhere is still being written
    time.sleep(0.5)
    first_nav(page).locator(".next").click()
    page.wait_for_function("() => document.querySelectorAll('.msg-user').length === 1")
    assert bubbles(page) == [text]

    # Reload mid-reply on the new branch: every token exactly once.
    assert page.locator(".msg-assistant").last.get_attribute("data-status") == "streaming"
    page.reload()
    page.wait_for_selector("html[data-ready='1']")
    assert first_nav(page).locator(".branch-count").inner_text() == "2/2"
    wait_reply_status(page, "complete", timeout=30000)
    assert norm(reply_text(page)) == text
    saved = client.api("GET", f"/api/conversations/{conv['id']}/").json()["messages"]
    assert norm(saved[-1]["content"]) == text and len(saved) == 2

    # And the old branch is intact behind ‹.
    first_nav(page).locator(".prev").click()
    page.wait_for_function("() => document.querySelectorAll('.msg-assistant').length === 3")
    assert [norm(t) for t in page.locator(".msg-assistant .msg-body").all_inner_texts()] == [
        "first question",
        "second question",
        "third question",
    ]


def test_switching_away_while_a_reply_streams_loses_nothing(open_page, live_site, make_site_user):
    client = make_site_user()
    conv = client.new_conversation(title="Regenerate while away")
    sent = client.send(conv["id"], "short one")
    client.wait_settled(conv["id"], sent["assistant_message"]["id"])
    page = open_page(live_site.url, client)
    open_conversation(page, conv["id"])
    # A long question, answered; then regenerate its reply and flip back and forth.
    text = words(250, "r")
    send(page, text)
    wait_replies(page, 2)
    wait_reply_status(page, "complete", timeout=30000)
    page.locator(".msg-assistant .action.regenerate").last.click()
    nav = page.locator(".msg-assistant").last.locator(".branch-nav")
    nav.wait_for(state="visible")
    assert nav.locator(".branch-count").inner_text() == "2/2"
    wait_reply_words(page, 10)
    nav.locator(".prev").click()
    page.wait_for_function(
        "() => { const n = [...document.querySelectorAll('.msg-assistant .branch-count')].pop();"
        " return n && n.textContent === '1/2' }"
    )
    assert page.locator("#stop").is_visible()  # still being written, off the page
    time.sleep(2)
    page.locator(".msg-assistant").last.locator(".branch-nav .next").click()
    page.wait_for_selector(".msg-assistant .branch-count:text('2/2')")
    wait_reply_status(page, "complete", timeout=30000)
    assert norm(reply_text(page)) == text
    # Regenerate, Stop with Esc on the new branch: the stop works wherever the reply is.
    page.locator(".msg-assistant .action.regenerate").last.click()
    page.wait_for_selector(".msg-assistant .branch-count:text('3/3')")
    wait_reply_words(page, 5)
    page.locator("#prompt").focus()
    page.keyboard.press("Escape")
    wait_reply_status(page, "cancelled", timeout=10000)
    assert (
        client.api("GET", f"/api/conversations/{conv['id']}/").json()["messages"][-1]["status"]
        == "cancelled"
    )


def create_preset(site: SiteServer, name: str, system_prompt: str, description: str = "") -> None:
    site.manage(
        "shell",
        "-c",
        (
            "from chat.models import Preset; "
            f"Preset.objects.create(name={name!r}, description={description!r}, "
            f"system_prompt={system_prompt!r}, max_tokens=50)"
        ),
    )


def test_pick_a_preset_and_its_system_prompt_is_used(chat_page, live_site):
    page, client = chat_page
    name = unique_name("Pirate")
    system_prompt = "Talk like a pirate in every single answer"
    create_preset(live_site, name, system_prompt, "Arr, matey.")
    page.reload()
    page.wait_for_selector("html[data-ready='1']")
    card = page.locator(".preset-card", has_text=name)
    card.click()
    assert card.get_attribute("aria-pressed") == "true"
    assert page.locator("#preset-badge").inner_text() == name
    send(page, "hello there sailor")
    wait_reply_status(page, "complete")
    conv_id = conversation_id(page)
    data = client.api("GET", f"/api/conversations/{conv_id}/").json()
    assert data["preset"]["name"] == name and data["system_prompt"] == ""
    reply = data["messages"][-1]
    assert reply["preset_name"] == name
    # The fake engine counts every prompt word: the system prompt's 8 and the question's 3.
    assert reply["prompt_tokens"] == len(system_prompt.split()) + 3
    assert f"preset {name}" in page.locator(".msg-assistant .msg-meta").inner_text()
    page.click("#settings-toggle")
    assert system_prompt in page.get_attribute("#set-system", "placeholder")
    assert page.locator("#set-system-hint").is_visible()
    # The chat can still set its own system prompt, which replaces the preset's.
    page.fill("#set-system", "Be plain")
    page.click("#settings-save")
    page.wait_for_selector("#settings-status:text('Saved.')")
    page.click("#settings-cancel")
    send(page, "and again")
    wait_replies(page, 2)
    wait_reply_status(page, "complete")
    second = client.api("GET", f"/api/conversations/{conv_id}/").json()["messages"][-1]
    assert second["prompt_tokens"] < reply["prompt_tokens"] + 10  # 2 + 3 + 3 + 2, not 8 more


def test_rate_a_reply_and_find_it_in_the_admin(chat_page, live_site, open_page, page_errors):
    page, client = chat_page
    send(page, "rate this answer please")
    wait_reply_status(page, "complete")
    conv_id = conversation_id(page)
    page.locator(".msg-assistant .action.rate-down").click()
    page.fill(".feedback-form textarea", "Too short, and it only repeats me.")
    page.locator(".feedback-form button[type=submit]").click()
    page.wait_for_selector(".feedback-comment:text('Too short')")
    page.reload()
    page.wait_for_selector("html[data-ready='1']")
    assert page.locator(".msg-assistant .action.rate-down").get_attribute("aria-pressed") == "true"
    assert "Too short" in page.locator(".feedback-comment").inner_text()
    # Change it: thumbs up instead.
    page.locator(".msg-assistant .action.rate-up").click()
    page.wait_for_selector(".msg-assistant .action.rate-up[aria-pressed='true']")
    page.locator(".feedback-form button", has_text="Close").click()
    page.locator(".msg-assistant .action.rate-down").click()
    page.wait_for_selector(".msg-assistant .action.rate-down[aria-pressed='true']")
    page.locator(".feedback-form button", has_text="Close").click()

    staff = unique_name("staff")
    live_site.manage(
        "shell",
        "-c",
        (
            "from django.contrib.auth.models import User; "
            f"User.objects.create_superuser({staff!r}, password='a-Long-pass-phrase-9')"
        ),
    )
    admin = open_page(live_site.url)
    page_errors.allow(r"status of 404")  # the admin asks for a /favicon.ico the site does not have
    admin.goto("/admin/login/")
    admin.fill("#id_username", staff)
    admin.fill("#id_password", "a-Long-pass-phrase-9")
    admin.click("input[type=submit]")
    admin.goto("/admin/chat/conversation/?feedback=down")
    assert admin.locator("#result_list").inner_text().count("rate this answer please") == 1
    admin.goto(f"/admin/chat/conversation/{conv_id}/transcript/")
    feedback = admin.locator(".feedback").inner_text()
    assert "👎 down" in feedback and "Too short, and it only repeats me." in feedback


@pytest.fixture(scope="module")
def public_site(live_dir, fake_inference):
    site = SiteServer(
        live_dir,
        live_dir / "public-site-var",
        INFERENCE_URLS=fake_inference.url,
        TOKENSTREAM_SHARE_PUBLIC=1,
        CHAT_MESSAGES_PER_MINUTE=1000,
    ).start()
    yield site
    site.stop()


def share_from_page(page, *, show_owner: bool) -> str:
    page.click("#share-toggle")
    page.wait_for_selector("#share-dialog[open]")
    if show_owner:
        page.check("#share-show-owner")
    page.click("#share-create")
    page.wait_for_selector("#share-link:not([hidden])")
    url = page.input_value("#share-url")
    page.locator("#share-dialog button[value=close]").click()
    return url


@pytest.mark.parametrize("public", [False, True])
def test_open_a_share_link_as_another_user_and_as_an_anonymous_visitor(
    open_page, live_site, public_site, public, page_errors
):
    site = public_site if public else live_site
    owner_name = unique_name("owner")
    owner = SiteClient(site.url).signup(owner_name)
    owner.new_conversation(title="Secret other chat")
    page = open_page(site.url, owner)
    page.goto("/")
    page.wait_for_selector("html[data-ready='1']")
    send(page, "Shared **bold** and $x^2$ <img src=x onerror=window.__xss=1>")
    wait_reply_status(page, "complete")
    url = share_from_page(page, show_owner=True)
    assert re.fullmatch(rf"{re.escape(site.url)}/s/[A-Za-z0-9_-]{{32,}}/", url), url
    send(page, "a later message")
    wait_replies(page, 2)
    wait_reply_status(page, "complete")

    reader = open_page(site.url, SiteClient(site.url).signup(unique_name("reader")))
    anonymous = open_page(site.url)
    for visitor in (reader, anonymous):
        visitor.goto(url)
        if visitor is anonymous and not public:
            assert "/accounts/login/" in visitor.url
            continue
        visitor.wait_for_selector("html[data-ready='1']")
        body = visitor.locator("#messages")
        assert body.locator(".msg-assistant strong").inner_text() == "bold"
        body.locator(".katex").first.wait_for()
        assert "a later message" not in body.inner_text()
        assert visitor.locator(".shared-owner").inner_text() == owner_name
        assert "Secret other chat" not in visitor.content()
        assert visitor.evaluate("() => window.__xss") is None
        assert body.locator("img, script").count() == 0

    # Stop sharing: the link is a 404 for everyone.
    page.click("#share-toggle")
    page.click("#share-revoke")
    page.wait_for_selector("#share-status:text('Sharing stopped')")
    page_errors.allow(r"status of 404")
    response = reader.goto(url)
    assert response.status == 404


def test_math_shortcuts_and_help(chat_page):
    page, client = chat_page
    send(
        page,
        "Euler: $e^{i\\pi}+1=0$ and a sum $$\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}$$ costs $5 or $10.",
    )
    wait_reply_status(page, "complete")
    reply = page.locator(".msg-assistant .msg-body").last
    reply.locator(".math-inline .katex").wait_for()
    assert reply.locator(".math-display .katex").count() == 1
    assert reply.locator(".math-inline").get_attribute("aria-label") == "e^{i\\pi}+1=0"
    assert "costs $5 or $10." in norm(reply.inner_text())
    # Help with ?, closed with Esc.
    page.locator("#chat-title").click()
    page.keyboard.press("?")
    page.wait_for_selector("#shortcuts-dialog[open]")
    assert "Previous / next version" in page.locator("#shortcuts-dialog").inner_text()
    page.keyboard.press("Escape")
    page.wait_for_selector("#shortcuts-dialog:not([open])", state="attached")
    # / focuses the message box; [ and ] flip versions; Ctrl+Shift+O starts a new chat.
    page.keyboard.press("/")
    assert page.evaluate("() => document.activeElement.id") == "prompt"
    page.locator(".msg-assistant .action.regenerate").last.click()
    page.wait_for_selector(".msg-assistant .branch-count:text('2/2')")
    wait_reply_status(page, "complete")
    page.locator("#chat-title").click()
    page.keyboard.press("[")
    page.wait_for_selector(".msg-assistant .branch-count:text('1/2')")
    page.keyboard.press("]")
    page.wait_for_selector(".msg-assistant .branch-count:text('2/2')")
    page.keyboard.press("Control+Shift+O")
    page.wait_for_url(re.compile(r"/$"))
    assert (
        page.locator(".msg").count() == 0 and page.locator("#chat-title").inner_text() == "New chat"
    )


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_tools_layouts_and_no_sideways_scroll(
    open_page, live_site, make_site_user, screenshot_dir, scheme
):
    """Screenshots of what this feature adds, desktop and phone, light and dark (looked at by
    a person); the page never scrolls sideways."""
    client = make_site_user()
    preset = unique_name("Tutor")
    create_preset(
        live_site, preset, "Explain step by step", "Patient explanations with worked examples."
    )
    presets = client.api("GET", "/api/presets/").json()["presets"]
    conv = client.new_conversation(preset=next(p["id"] for p in presets if p["name"] == preset))
    first = client.send(conv["id"], "What is the integral of x squared?")
    client.wait_settled(conv["id"], first["assistant_message"]["id"])
    edited = client.api(
        "POST",
        f"/api/messages/{first['user_message']['id']}/edit/",
        {
            "content": "Integrate: $$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$ and inline $e^{i\\pi}+1=0$, "
            "code `x**2`, and a " + "long" * 40 + " word."
        },
    ).json()
    reply = client.wait_settled(conv["id"], edited["assistant_message"]["id"])
    client.api(
        "PUT",
        f"/api/messages/{reply['id']}/feedback/",
        {"rating": "up", "comment": "Clear, and the formula renders nicely."},
    )
    share = client.api(
        "POST", f"/api/conversations/{conv['id']}/share/", {"show_owner": True}
    ).json()
    for name, (width, height) in (("desktop", (1280, 800)), ("phone", (390, 844))):
        client.api(
            "POST",
            f"/api/conversations/{conv['id']}/switch/",
            {"message_id": edited["user_message"]["id"]},
        )
        page = open_page(
            live_site.url, client, viewport={"width": width, "height": height}, color_scheme=scheme
        )
        open_conversation(page, conv["id"])
        page.locator(".msg-assistant .katex").first.wait_for()

        def shot(what, page=page, name=name):
            page.screenshot(path=str(screenshot_dir / f"tools-{name}-{scheme}-{what}.png"))

        shot("branches")
        sideways = page.evaluate(
            "() => [document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]"
        )
        assert sideways[0] <= sideways[1], sideways
        page.click("#share-toggle")
        page.wait_for_selector("#share-dialog[open]")
        shot("share-dialog")
        page.keyboard.press("Escape")
        if name == "desktop":  # phones hide the shortcuts button: no keyboard
            page.click("#shortcuts-toggle")
            page.wait_for_selector("#shortcuts-dialog[open]")
            shot("shortcuts")
            page.keyboard.press("Escape")
        else:
            assert page.locator("#shortcuts-toggle").is_hidden()
        page.locator(".msg-user .branch-nav .prev").first.click()
        page.wait_for_selector(".msg-user .branch-count:text('1/2')")
        page.click("#settings-toggle")
        shot("settings-preset")
        page.goto("/")
        page.wait_for_selector("html[data-ready='1']")
        page.locator(".preset-card", has_text=preset).wait_for()
        shot("new-chat-presets")
        page.goto(share["url"])
        page.wait_for_selector("html[data-ready='1']")
        page.locator(".katex").first.wait_for()
        shot("shared")
        sideways = page.evaluate(
            "() => [document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]"
        )
        assert sideways[0] <= sideways[1], sideways
