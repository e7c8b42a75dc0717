"""Access and hardening: sign-in throttling, production settings, input parsers."""

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest
from django.core.cache import cache
from django.test import Client
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chat.validation import InvalidInput, clean_number, message_content, parse_json_object
from tests.support.factories import create_user
from tests.support.processes import ROOT

PASSWORD = "pw-Long-enough-1"


@pytest.fixture(autouse=True)
def clear_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.mark.django_db
def test_sign_in_is_throttled_after_repeated_wrong_passwords(settings):
    settings.LOGIN_MAX_FAILURES = 3
    create_user("alice")
    client = Client()
    for _ in range(3):
        response = client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
        assert response.status_code == 200
    blocked = client.post("/accounts/login/", {"username": "alice", "password": PASSWORD})
    assert blocked.status_code == 429
    assert "Too many failed sign-ins" in blocked.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_other_users_can_still_sign_in_while_one_is_throttled(settings):
    settings.LOGIN_MAX_FAILURES = 2
    create_user("alice")
    create_user("bob")
    client = Client()
    for _ in range(3):
        client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
    response = client.post("/accounts/login/", {"username": "bob", "password": PASSWORD})
    assert response.status_code == 302


@pytest.mark.django_db
def test_signup_can_be_turned_off(settings):
    settings.SIGNUP_ENABLED = False
    assert Client().get("/accounts/signup/").status_code == 404


@pytest.mark.django_db
def test_pages_need_sign_in():
    response = Client().get("/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def production_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "PYTEST"))}
    env.update(
        DJANGO_SECRET_KEY="x7!" + "k" * 60 + "Zq9#",
        DJANGO_HTTPS="1",
        DJANGO_DEBUG="0",
        DJANGO_ALLOWED_HOSTS="chat.example.com",
        DJANGO_SETTINGS_MODULE="tokenstream_site.settings",
    )
    env.update(extra)
    return env


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=production_env(TOKENSTREAM_VAR_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_cookies_are_secure_httponly_and_samesite(tmp_path):
    code = (
        "import django; django.setup(); from django.conf import settings as s; import json; "
        "print(json.dumps([s.SESSION_COOKIE_SECURE, s.SESSION_COOKIE_HTTPONLY, "
        "s.SESSION_COOKIE_SAMESITE, s.CSRF_COOKIE_SECURE]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=production_env(TOKENSTREAM_VAR_DIR=str(tmp_path)),
    )
    assert json.loads(result.stdout) == [True, True, "Lax", True], result.stderr


@given(st.binary(max_size=300))
@hsettings(max_examples=300, deadline=None)
def test_any_body_parses_to_an_object_or_a_readable_error(body):
    try:
        assert isinstance(parse_json_object(body), dict)
    except InvalidInput as exc:
        assert exc.message.endswith(".")


@given(st.text(min_size=1, max_size=500).filter(lambda t: t.strip() and "\x00" not in t))
@hsettings(max_examples=200, deadline=None)
def test_valid_message_text_is_accepted_unchanged(text):
    body = json.dumps({"content": text}).encode()
    assert message_content(parse_json_object(body)) == text


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(),
        st.booleans(),
        st.text(max_size=5),
        st.none(),
        st.lists(st.integers(), max_size=2),
    )
)
@hsettings(max_examples=300, deadline=None)
def test_numbers_are_accepted_only_when_finite_and_in_range(value):
    try:
        result = clean_number(value, name="temperature", low=0, high=2)
    except InvalidInput:
        return
    assert result is None or (0 <= result <= 2 and not isinstance(value, bool))


def test_with_redis_every_site_process_counts_the_same_sign_in_failures(tmp_path):
    # Django's Redis cache (or the site's subclass of it, chat/cache.py): one Redis for all
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "from django.utils.module_loading import import_string as load; "
        "from django.core.cache.backends.redis import RedisCache; "
        "print(issubclass(load(s.CACHES['default']['BACKEND']), RedisCache))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=production_env(TOKENSTREAM_VAR_DIR=str(tmp_path), REDIS_URL="redis://127.0.0.1:6379/0"),
    )
    assert result.stdout.strip() == "True", result.stderr


def signup(client: Client, name: str, address: str):
    return client.post(
        "/accounts/signup/",
        {"username": name, "password1": PASSWORD, "password2": PASSWORD},
        REMOTE_ADDR=address,
    )


@pytest.mark.django_db
def test_sign_ups_from_one_address_are_limited_per_hour(settings):
    settings.SIGNUPS_PER_HOUR = 3
    statuses = [signup(Client(), f"new{n}", "192.0.2.1").status_code for n in range(5)]
    assert statuses == [302, 302, 302, 429, 429]
    assert "Too many accounts" in signup(Client(), "new9", "192.0.2.1").content.decode()
    assert signup(Client(), "elsewhere", "198.51.100.7").status_code == 302


@pytest.mark.django_db
def test_a_refused_sign_up_form_does_not_use_up_the_allowance(settings):
    settings.SIGNUPS_PER_HOUR = 2
    for _ in range(4):
        Client().post(
            "/accounts/signup/",
            {"username": "x", "password1": "a", "password2": "b"},
            REMOTE_ADDR="192.0.2.1",
        )
    assert signup(Client(), "fine", "192.0.2.1").status_code == 302


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_generated_secret_key_is_private_from_the_moment_it_exists(tmp_path, monkeypatch):
    """Created private, not written and then narrowed: with chmod doing nothing and a umask
    that hides nothing, the key must still be readable by its owner only."""
    from tokenstream_site.devsecret import dev_secret_key

    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
    monkeypatch.setattr(pathlib.Path, "chmod", lambda *a, **k: None)
    old_umask = os.umask(0)
    try:
        key = dev_secret_key(tmp_path / "var")
    finally:
        os.umask(old_umask)
    assert len(key) > 50
    assert mode(tmp_path / "var" / "secret_key") == 0o600
    assert mode(tmp_path / "var") == 0o700


def run_migrate(var_dir, umask=0o022):
    env = production_env(TOKENSTREAM_VAR_DIR=str(var_dir), DJANGO_SECRET_KEY="")
    env.pop("DJANGO_SECRET_KEY")
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(umask),
    )
    assert result.returncode == 0, result.stderr


def test_var_dir_database_and_key_are_created_private(tmp_path):
    var = tmp_path / "var"
    run_migrate(var)
    assert mode(var) == 0o700
    assert mode(var / "secret_key") == 0o600
    assert mode(var / "db.sqlite3") == 0o600
    assert all(mode(extra) == 0o600 for extra in var.glob("db.sqlite3-*"))


def test_an_existing_world_readable_var_dir_is_made_private(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    (var / "db.sqlite3").touch(mode=0o644)
    os.chmod(var, 0o755)
    os.chmod(var / "db.sqlite3", 0o644)
    run_migrate(var)
    assert (mode(var), mode(var / "db.sqlite3")) == (0o700, 0o600)


def manage_check(tmp_path, **env):
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=production_env(TOKENSTREAM_VAR_DIR=str(tmp_path), **env),
    )


def test_production_refuses_to_start_with_the_shipped_placeholder_secrets(tmp_path):
    shipped = {}
    for line in (ROOT / "deploy" / "tokenstream.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, value = line.split("=", 1)
            shipped[name] = value
    shipped.pop("DATABASE_URL")
    shipped.pop("REDIS_URL")
    result = manage_check(tmp_path, **shipped)
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr and "METRICS_TOKEN" in result.stderr
    assert manage_check(tmp_path, METRICS_TOKEN="change-me-too").returncode != 0
    assert manage_check(tmp_path, METRICS_TOKEN="a-real-random-token-4f9c1e").returncode == 0
