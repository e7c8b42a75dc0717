"""Usage, quotas and API keys in a real browser: the settings panel's usage and keys, a
quota's 429 shown where the user typed, and the staff dashboard (screenshots in
artifacts/screenshots/usage-*.png)."""

import time

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.live]


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def wait_reply_status(page, status: str, timeout: float = 20000) -> None:
    page.wait_for_function(
        "s => { const m = [...document.querySelectorAll('.msg-assistant')].pop();"
        " return Boolean(m) && m.dataset.status === s }",
        arg=status,
        timeout=timeout,
    )


def shell(site, code: str) -> str:
    return site.manage("shell", "-c", code)


def set_daily_quota(site, username: str, tokens: int) -> None:
    shell(
        site,
        "from django.contrib.auth import get_user_model; from chat.models import TokenQuota; "
        f"u = get_user_model().objects.get(username={username!r}); "
        f"TokenQuota.objects.update_or_create(user=u, defaults={{'daily_tokens': {tokens}}})",
    )


def open_settings(page) -> None:
    page.click("#settings-toggle")
    page.wait_for_selector("#usage .usage-row")


def username(page) -> str:
    return page.get_attribute("#app", "data-user")


def test_usage_panel_shows_what_replies_used_and_manages_api_keys(chat_page, screenshot_dir):
    page, client = chat_page
    page.on("dialog", lambda dialog: dialog.accept())
    send(page, "count these five words")
    wait_reply_status(page, "complete")
    open_settings(page)
    today = page.locator("#usage .usage-row").first
    assert "1 reply" in today.inner_text() and "tokens" in today.inner_text()
    assert (
        page.locator("#usage .usage-row", has_text="Daily quota").inner_text().endswith("No limit")
    )
    assert page.inner_text("#api-base").endswith("/v1")

    page.fill("#key-name", "laptop script")
    page.click("#key-create")
    page.wait_for_selector("#key-secret:not([hidden])")
    secret = page.inner_text("#key-secret-value")
    assert secret.startswith("ts-")
    item = page.locator("#key-list .key-item")
    assert item.count() == 1 and "laptop script" in item.inner_text()
    assert secret not in item.inner_text() and secret[:11] in item.inner_text()
    page.set_viewport_size({"width": 1280, "height": 1250})  # the panel is 60% of the height
    page.screenshot(path=str(screenshot_dir / "usage-settings-panel.png"))
    page.set_viewport_size({"width": 1280, "height": 800})

    # The key works with /v1, and the call shows up in the usage and in the list.
    response = client.http.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"messages": [{"role": "user", "content": "from a script"}]},
    )
    assert response.status_code == 200, response.text
    page.click("#settings-toggle")  # close: the secret is forgotten
    assert page.locator("#key-secret").is_hidden()
    open_settings(page)
    page.wait_for_function("() => document.querySelector('#usage').innerText.includes('2 replies')")
    # The usage and the key list are two requests: wait for the list too.
    page.wait_for_function(
        "() => document.querySelector('#key-list').innerText.includes('last used')"
    )

    page.click("#key-list .key-revoke")
    page.wait_for_selector("#key-list .key-empty")
    revoked = client.http.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})
    assert revoked.status_code == 401
    page.reload()
    page.wait_for_selector("html[data-ready='1']")
    page.wait_for_selector("#conv-list .conv-badge")
    assert (
        page.locator("#conv-list li", has_text="from a script").locator(".conv-badge").inner_text()
        == "API"
    )


def test_past_a_quota_the_page_says_when_it_resets_where_the_user_typed(
    chat_page, live_site, page_errors, screenshot_dir
):
    page, _ = chat_page
    page_errors.allow(r"status of 429")
    send(page, "one two three")
    wait_reply_status(page, "complete")
    set_daily_quota(live_site, username(page), 1)
    send(page, "and again")
    notice = page.locator("#notice")
    notice.wait_for(state="visible")
    text = notice.inner_text()
    assert "daily quota of 1 token." in text and "resets at" in text and "UTC" in text
    assert page.input_value("#prompt") == "and again"  # given back to send later
    page.screenshot(path=str(screenshot_dir / "usage-quota-429.png"))
    open_settings(page)
    assert page.locator("#usage .usage-row.over", has_text="Daily quota").count() == 1
    page.locator("#account").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "usage-quota-panel.png"))


def test_the_staff_dashboard_loads_fast_with_figures_charts_and_live_servers(
    open_page, live_site, make_site_user, screenshot_dir
):
    staff = make_site_user()
    name = staff.http.get("/").text.split('data-user="', 1)[1].split('"', 1)[0]
    shell(
        live_site,
        "from django.contrib.auth import get_user_model; "
        f"get_user_model().objects.filter(username={name!r}).update(is_staff=True, is_superuser=True); "
        "from bench.usage_dashboard import generate; generate(users=12, days=45, prefix='demo')",
    )
    # The server's answer, once its templates are loaded (bench.usage_dashboard measures it
    # on a year of 200 users); the browser's whole load varies with the machine's load.
    staff.http.get("/admin/usage/")
    answer = staff.http.get("/admin/usage/")
    assert answer.status_code == 200 and answer.elapsed.total_seconds() < 1.0, answer.elapsed
    page = open_page(live_site.url, staff, viewport={"width": 1400, "height": 900})
    started = time.monotonic()
    response = page.goto("/admin/usage/")
    assert response.status == 200 and time.monotonic() - started < 3.0
    for table in ("#usage-users", "#usage-models", "#usage-days"):
        assert page.locator(f"{table} tbody tr").count() >= 2
    assert page.locator("#chart-tokens rect.completion_tokens").count() >= 25
    assert page.locator("#chart-replies rect.failures").count() >= 1
    page.wait_for_selector("#usage-servers[data-checked='1']")
    server = page.locator("#usage-servers tbody tr").first
    assert "ready" in server.inner_text() and "fake" in server.inner_text()
    page.screenshot(path=str(screenshot_dir / "usage-dashboard.png"), full_page=True)
    csv = staff.http.get("/admin/usage/usage.csv")
    assert csv.status_code == 200 and csv.text.startswith("section,name,prompt_tokens")
