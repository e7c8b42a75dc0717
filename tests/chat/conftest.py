"""Small factories for the chat tests, a live fake inference server for the commands, and
servers of their own for the tests that need them (PostgreSQL, Redis with a password)."""

import shutil
import subprocess
import time

import pytest
import redis
from django.contrib.auth.models import Permission

from chat.inference_client import reset_client
from tests.support import factories
from tests.support.api import signed_in
from tests.support.postgres import Unavailable, scratch_database
from tests.support.processes import InferenceServer, free_port


@pytest.fixture
def make_user(db):
    def make(username: str | None = None, *, staff: bool = False, perms: tuple[str, ...] = ()):
        user = factories.create_user(username, is_staff=staff)
        for codename in perms:
            user.user_permissions.add(Permission.objects.get(codename=codename))
        return user

    return make


@pytest.fixture
def reviewer(make_user):
    """Staff who may read every transcript (chat.view_conversation), not a superuser."""
    return make_user("reviewer", staff=True, perms=("view_conversation",))


@pytest.fixture
def make_conversation(db):
    return factories.create_conversation


@pytest.fixture
def make_message(db):
    def make(conversation, content: str = "hello", *, role: str = "user", **fields):
        return factories.create_message(conversation, role=role, content=content, **fields)

    return make


@pytest.fixture
def fresh_inference_client():
    """get_client() caches a client built from settings.INFERENCE_URLS: rebuild it around
    a test that changes them."""
    reset_client()
    yield
    reset_client()


@pytest.fixture
def stopped_inference_url(settings, fresh_inference_client):
    """INFERENCE_URLS pointing at a port where nothing listens."""
    url = f"http://127.0.0.1:{free_port()}"
    settings.INFERENCE_CLIENT = "chat.inference_client.http.HttpInferenceClient"
    settings.INFERENCE_URLS = [url]
    return url


@pytest.fixture(scope="session")
def running_inference(tmp_path_factory):
    """`python -m inference` with the fake engine; the tests that need it skip without it."""
    server = InferenceServer(
        tmp_path_factory.mktemp("inference"), engine="fake", FAKE_TOKENS_PER_SECOND=200
    )
    try:
        server.start(timeout=60)
    except (RuntimeError, TimeoutError, OSError) as exc:
        server.stop()
        pytest.skip(f"the fake inference server did not start: {exc}\n{server.process.log_tail()}")
    yield server
    server.stop()


@pytest.fixture
def live_inference_url(running_inference, settings, fresh_inference_client):
    settings.INFERENCE_CLIENT = "chat.inference_client.http.HttpInferenceClient"
    settings.INFERENCE_URLS = [running_inference.url]
    return running_inference.url


@pytest.fixture(scope="module")
def postgres_url():
    """A new database on the local PostgreSQL for this module; skips when it is absent."""
    try:
        with scratch_database() as url:
            yield url
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def user(db):
    return factories.create_user()


@pytest.fixture
def api(user):
    """The user signed in, through Django's test client."""
    return signed_in(user)


@pytest.fixture
def redis_with_password():
    """A Redis server of the test's own that wants a password: the URL's password and
    database must be used."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--requirepass", "s3cret"],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, password="s3cret")
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.05)
    yield port
    server.terminate()
    server.wait(10)
