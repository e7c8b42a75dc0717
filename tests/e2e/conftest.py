"""Browser fixtures: Debian's Chromium driven by Playwright's sync API against the live site."""

import re
from pathlib import Path

import pytest

from tests.support.processes import ROOT
from tests.support.site_client import SiteClient

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_collection_modifyitems(config, items):
    if Path(CHROMIUM).exists():
        return
    skip = pytest.mark.skip(reason=f"{CHROMIUM} is missing: apt-get install -y chromium")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="package")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS
        )
        yield browser
        browser.close()


class PageErrors:
    """JavaScript errors and console errors seen on a page; the test fails on any."""

    def __init__(self):
        self.errors: list[str] = []
        self.allowed: list[re.Pattern] = []

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def watch(self, page) -> None:
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on(
            "console",
            lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text}"),
        )

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]


@pytest.fixture
def page_errors():
    errors = PageErrors()
    yield errors
    assert errors.unexpected() == [], "JavaScript errors on the page"


@pytest.fixture
def open_page(browser, page_errors):
    """open_page(site_url, client=None, **context options) -> a page (signed in as client)."""
    contexts = []

    def open_(site_url: str, client: SiteClient | None = None, **options):
        options.setdefault("viewport", {"width": 1280, "height": 800})
        context = browser.new_context(base_url=site_url, **options)
        context.set_default_timeout(15000)
        contexts.append(context)
        if client is not None:
            context.add_cookies(
                [
                    {"name": c.name, "value": c.value, "url": site_url}
                    for c in client.http.cookies.jar
                ]
            )
        page = context.new_page()
        page_errors.watch(page)
        return page

    yield open_
    for context in contexts:
        context.close()


@pytest.fixture
def chat_page(open_page, live_site, make_site_user):
    """A signed-in user on the chat home page: (page, client)."""
    client = make_site_user()
    page = open_page(live_site.url, client)
    page.goto("/")
    page.wait_for_selector("html[data-ready='1']")
    return page, client


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
