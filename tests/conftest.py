import pytest

from tests.support.factories import unique_name
from tests.support.processes import InferenceServer, SiteServer
from tests.support.site_client import SiteClient


@pytest.fixture(scope="session")
def live_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("live")


@pytest.fixture(scope="session")
def fake_inference(live_dir):
    """`python -m inference` with the fake engine, shared by the live tests."""
    server = InferenceServer(live_dir, engine="fake", FAKE_TOKENS_PER_SECOND=50).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def live_site(live_dir, fake_inference):
    """daphne serving the site against the fake inference server."""
    site = SiteServer(
        live_dir,
        live_dir / "site-var",
        INFERENCE_URLS=fake_inference.url,
        INFERENCE_FIRST_TOKEN_TIMEOUT=10,
        INFERENCE_READ_TIMEOUT=5,
        CHAT_MESSAGES_PER_MINUTE=1000,
        CHAT_MAX_STREAMING_PER_USER=50,
    ).start()
    yield site
    site.stop()
    print(site.process.log_tail())


@pytest.fixture
def site_user(live_site) -> SiteClient:
    return SiteClient(live_site.url).signup(unique_name())


@pytest.fixture
def make_site_user(live_site):
    return lambda: SiteClient(live_site.url).signup(unique_name())
