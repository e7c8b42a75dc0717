"""Per-user limits under concurrency on PostgreSQL: many sends of one user at the same
moment (page and API alike) never pass the per-user stream limit, and never go past a
token quota by more than the replies already running. Skipped, with the reason, where
PostgreSQL is not running."""

import threading
import time
import uuid

import httpx
import pytest

from tests.support.processes import InferenceServer, SiteServer
from tests.support.site_client import SiteClient

pytestmark = [pytest.mark.live, pytest.mark.scaled]

POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
STREAMS = 3
AT_ONCE = 24
SLOW = " ".join(f"w{i}" for i in range(40))  # four seconds at 10 tokens/s


@pytest.fixture(scope="module")
def postgres_url():
    psycopg = pytest.importorskip("psycopg")
    name = f"tokenstream_race_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL is not running at 127.0.0.1:5432 ({exc})")
    admin.execute(f'CREATE DATABASE "{name}"')
    yield f"postgres://postgres@127.0.0.1:5432/{name}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture(scope="module")
def pg_site(live_dir, postgres_url):
    inference = InferenceServer(live_dir, engine="fake", FAKE_TOKENS_PER_SECOND=10).start()
    site = SiteServer(
        live_dir,
        live_dir / "race-site",
        DATABASE_URL=postgres_url,
        INFERENCE_URLS=inference.url,
        CHAT_MAX_STREAMING_PER_USER=STREAMS,
        CHAT_MESSAGES_PER_MINUTE=1000,
        DATABASE_POOL_SIZE=40,
    ).start()
    yield site
    site.stop()
    inference.stop()


def twin(site: SiteServer, client: SiteClient) -> SiteClient:
    """The same signed-in user on a connection of its own (one per thread)."""
    other = SiteClient(site.url)
    other.http.cookies = client.http.cookies
    return other


def all_at_once(calls) -> list:
    """Run the calls in threads released together; their results in order."""
    results = [None] * len(calls)
    gate = threading.Barrier(len(calls))

    def run(index, call):
        gate.wait()
        try:
            results[index] = call()
        except httpx.HTTPError as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def page_send(site, client, conversation_id):
    other = twin(site, client)
    return lambda: (
        other.api(
            "POST", f"/api/conversations/{conversation_id}/messages/", {"content": SLOW}
        ).status_code
    )


def api_call(site, secret):
    def call():
        response = httpx.post(
            f"{site.url}/v1/chat/completions",
            timeout=60,
            headers={"Authorization": f"Bearer {secret}"},
            json={"messages": [{"role": "user", "content": SLOW}]},
        )
        return response.status_code

    return call


def username_of(client: SiteClient) -> str:
    return client.http.get("/").text.split('data-user="', 1)[1].split('"', 1)[0]


def streaming_replies(client: SiteClient) -> list[tuple[str, str]]:
    found = []
    for conversation in client.api("GET", "/api/conversations/").json()["conversations"]:
        detail = client.api("GET", f"/api/conversations/{conversation['id']}/").json()
        found += [
            (conversation["id"], m["id"]) for m in detail["messages"] if m["status"] == "streaming"
        ]
    return found


def stop_all_and_wait(client: SiteClient) -> None:
    for conversation_id, message_id in streaming_replies(client):
        client.api("POST", f"/api/messages/{message_id}/stop/")
        client.wait_settled(conversation_id, message_id)


def today_total(client: SiteClient) -> int:
    return client.api("GET", "/api/usage/").json()["today"]["total_tokens"]


def new_user(site) -> SiteClient:
    return SiteClient(site.url).signup(f"race{uuid.uuid4().hex[:6]}")


def test_many_sends_at_once_never_pass_the_stream_limit(pg_site):
    client = new_user(pg_site)
    secret = client.api("POST", "/api/keys/", {"name": "race"}).json()["key"]
    conversations = [client.new_conversation()["id"] for _ in range(AT_ONCE // 2)]
    calls = [page_send(pg_site, client, c) for c in conversations]
    calls += [api_call(pg_site, secret) for _ in range(AT_ONCE // 2)]
    results = all_at_once(calls)
    accepted = [r for r in results if r in (200, 202)]
    assert len(accepted) == STREAMS, results
    assert sorted(set(results) - {200, 202}) == [429], results
    stop_all_and_wait(client)


def test_at_the_quota_every_send_at_once_is_refused(pg_site):
    client = new_user(pg_site)
    conversation = client.new_conversation()["id"]
    reply = client.send(conversation, "a few words")["assistant_message"]["id"]
    client.wait_settled(conversation, reply)
    used = today_total(client)
    assert used > 0
    set_daily_quota(pg_site, username_of(client), used)
    conversations = [client.new_conversation()["id"] for _ in range(AT_ONCE)]
    results = all_at_once([page_send(pg_site, client, c) for c in conversations])
    assert results == [429] * AT_ONCE


def test_below_the_quota_sends_at_once_overshoot_by_at_most_the_running_replies(pg_site):
    client = new_user(pg_site)
    conversation = client.new_conversation()["id"]
    reply = client.send(conversation, "a few words")["assistant_message"]["id"]
    client.wait_settled(conversation, reply)
    used = today_total(client)
    set_daily_quota(pg_site, username_of(client), used + 1)
    conversations = [client.new_conversation()["id"] for _ in range(AT_ONCE)]
    results = all_at_once([page_send(pg_site, client, c) for c in conversations])
    assert results.count(202) == STREAMS and results.count(429) == AT_ONCE - STREAMS, results
    deadline = time.monotonic() + 30
    while streaming_replies(client):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    # Each running reply finished (never cut); together they went past the quota…
    assert today_total(client) > used + 1
    # …and from then on nothing more is accepted.
    refused = client.api(
        "POST", f"/api/conversations/{conversations[0]}/messages/", {"content": "x"}
    )
    assert refused.status_code == 429 and "daily quota" in refused.json()["error"]["message"]


def set_daily_quota(site: SiteServer, username: str, tokens: int) -> None:
    site.manage(
        "shell",
        "-c",
        (
            "from django.contrib.auth import get_user_model; from chat.models import TokenQuota; "
            f"u = get_user_model().objects.get(username={username!r}); "
            f"TokenQuota.objects.update_or_create(user=u, defaults={{'daily_tokens': {tokens}}})"
        ),
    )
