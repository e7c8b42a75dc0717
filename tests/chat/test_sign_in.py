"""Sign-in guessing: counted before the password check, per account and where it comes
from, so a stranger cannot lock the owner out; client addresses behind a proxy."""

import threading
import time

import pytest
from django.core.cache import cache
from django.test import Client, RequestFactory

from chat.auth import DEVICE_COOKIE
from chat.client_address import client_address, client_key
from tests.support.factories import create_user

PASSWORD = "pw-Long-enough-1"


@pytest.fixture(autouse=True)
def clear_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def clock(monkeypatch):
    """time.time under the test's control (the cache's expiry follows it too)."""
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += seconds

    return advance


def sign_in(client: Client, username: str, password: str, address: str = "10.0.0.1", **headers):
    return client.post(
        "/accounts/login/",
        {"username": username, "password": password},
        REMOTE_ADDR=address,
        **headers,
    )


def trusted_browser(username: str, address: str = "10.0.0.1") -> Client:
    """A browser where `username` signed in before, now signed out."""
    client = Client()
    assert sign_in(client, username, PASSWORD, address).status_code == 302
    assert DEVICE_COOKIE in client.cookies
    client.post("/accounts/logout/", REMOTE_ADDR=address)
    return client


@pytest.mark.django_db(transaction=True)
def test_simultaneous_wrong_passwords_are_counted_before_any_is_checked(settings):
    settings.LOGIN_MAX_FAILURES = 5
    create_user("bob")
    barrier = threading.Barrier(20)
    statuses = []

    def guess(number: int) -> None:
        from django.db import connection

        try:
            barrier.wait()
            statuses.append(sign_in(Client(), "bob", f"guess-{number}").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200] * 5 + [429] * 15


@pytest.mark.django_db
def test_a_strangers_guesses_do_not_lock_the_owner_out_from_another_address(settings):
    settings.LOGIN_MAX_FAILURES = 5
    create_user("bob")
    stranger = Client()
    statuses = [sign_in(stranger, "bob", "wrong", "203.0.113.9").status_code for _ in range(8)]
    assert statuses[:5] == [200] * 5 and set(statuses[5:]) == {429}
    assert sign_in(Client(), "bob", PASSWORD, "198.51.100.7").status_code == 302


@pytest.mark.django_db
def test_the_owners_trusted_browser_signs_in_even_behind_the_strangers_address(settings):
    settings.LOGIN_MAX_FAILURES = 5
    create_user("bob")
    bobs_browser = trusted_browser("bob", "192.0.2.1")
    for _ in range(10):
        sign_in(Client(), "bob", "wrong", "192.0.2.1")
    assert sign_in(Client(), "bob", PASSWORD, "192.0.2.1").status_code == 429
    assert sign_in(bobs_browser, "bob", PASSWORD, "192.0.2.1").status_code == 302


@pytest.mark.django_db
def test_failures_on_many_names_from_one_address_spare_trusted_browsers_behind_it(settings):
    settings.LOGIN_MAX_FAILURES_PER_ADDRESS = 10
    create_user("alice")
    create_user("carol")
    alices_browser = trusted_browser("alice", "192.0.2.1")
    for number in range(50):
        sign_in(Client(), f"name{number}", "wrong", "192.0.2.1")
    assert sign_in(alices_browser, "alice", PASSWORD, "192.0.2.1").status_code == 302
    refused = sign_in(Client(), "carol", PASSWORD, "192.0.2.1")
    assert refused.status_code == 429
    assert "from your network" in refused.content.decode()
    assert sign_in(Client(), "carol", PASSWORD, "198.51.100.7").status_code == 302


@pytest.mark.django_db
def test_failures_on_one_name_from_many_addresses_are_limited_but_spare_its_trusted_browser(
    settings,
):
    settings.LOGIN_MAX_FAILURES_PER_ACCOUNT = 10
    create_user("bob")
    bobs_browser = trusted_browser("bob", "192.0.2.1")
    for number in range(12):
        sign_in(Client(), "bob", "wrong", f"203.0.113.{number}")
    assert sign_in(Client(), "bob", PASSWORD, "198.51.100.7").status_code == 429
    assert sign_in(bobs_browser, "bob", PASSWORD, "198.51.100.7").status_code == 302


@pytest.mark.django_db
def test_delays_double_with_each_failure_after_the_free_ones(settings, clock):
    settings.LOGIN_MAX_FAILURES, settings.LOGIN_DELAY_SECONDS = 2, 10
    settings.LOGIN_LOCKOUT_SECONDS = 900
    create_user("bob")
    client = Client()
    assert [sign_in(client, "bob", "wrong").status_code for _ in range(2)] == [200, 200]
    refused = sign_in(client, "bob", PASSWORD)
    assert refused.status_code == 429 and refused["Retry-After"] == "10"
    clock(11)
    assert sign_in(client, "bob", "wrong").status_code == 200  # one guess, then 20 s
    clock(11)
    assert sign_in(client, "bob", PASSWORD).status_code == 429
    clock(10)
    assert sign_in(client, "bob", PASSWORD).status_code == 302


@pytest.mark.django_db
def test_a_correct_password_is_not_counted_as_a_failure(settings):
    settings.LOGIN_MAX_FAILURES_PER_ADDRESS = 3
    for name in ("a1", "a2", "a3", "a4", "a5"):
        create_user(name)
        assert sign_in(Client(), name, PASSWORD, "192.0.2.1").status_code == 302


@pytest.mark.django_db
def test_the_admin_sign_in_form_has_the_same_brake(settings):
    settings.LOGIN_MAX_FAILURES = 3
    create_user("root", is_staff=True)
    client = Client()
    for _ in range(3):
        client.post(
            "/admin/login/", {"username": "root", "password": "wrong"}, REMOTE_ADDR="192.0.2.1"
        )
    blocked = client.post(
        "/admin/login/", {"username": "root", "password": PASSWORD}, REMOTE_ADDR="192.0.2.1"
    )
    assert blocked.status_code == 429
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_behind_a_trusted_proxy_each_client_is_counted_by_the_address_the_proxy_saw(settings):
    settings.LOGIN_MAX_FAILURES, settings.TRUSTED_PROXIES = 3, ["127.0.0.1/32"]
    create_user("bob")
    for number in range(6):  # a guesser who also writes his own X-Forwarded-For
        sign_in(
            Client(),
            "bob",
            "wrong",
            "127.0.0.1",
            HTTP_X_FORWARDED_FOR=f"10.9.9.{number}, 203.0.113.9",
        )
    assert (
        sign_in(
            Client(), "bob", PASSWORD, "127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9"
        ).status_code
        == 429
    )
    assert (
        sign_in(
            Client(), "bob", PASSWORD, "127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.7"
        ).status_code
        == 302
    )


@pytest.mark.parametrize(
    "remote, forwarded, trusted, expected",
    [
        ("203.0.113.9", "1.2.3.4", [], "203.0.113.9"),
        ("203.0.113.9", "1.2.3.4", ["127.0.0.1/32"], "203.0.113.9"),
        ("127.0.0.1", "1.2.3.4", ["127.0.0.1/32"], "1.2.3.4"),
        ("127.0.0.1", "6.6.6.6, 1.2.3.4", ["127.0.0.1/32"], "1.2.3.4"),
        ("127.0.0.1", "6.6.6.6, 1.2.3.4, 10.0.0.2", ["127.0.0.1/32", "10.0.0.0/8"], "1.2.3.4"),
        ("127.0.0.1", "", ["127.0.0.1/32"], "127.0.0.1"),
        ("127.0.0.1", "1.2.3.4, junk", ["127.0.0.1/32"], "127.0.0.1"),
        ("::1", "2001:db8::5", ["::1/128"], "2001:db8::5"),
        ("::ffff:127.0.0.1", "1.2.3.4", ["127.0.0.1/32"], "1.2.3.4"),
    ],
)
def test_client_address_believes_only_trusted_proxies_and_their_right_most_hops(
    settings, remote, forwarded, trusted, expected
):
    settings.TRUSTED_PROXIES = trusted
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected


def test_ipv6_clients_are_counted_per_64_block():
    assert (
        client_key("2001:db8:1:2:aaaa::1")
        == client_key("2001:db8:1:2:bbbb::9")
        == "2001:db8:1:2::/64"
    )
    assert client_key("192.0.2.1") == "192.0.2.1"
