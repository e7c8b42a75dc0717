"""Scaled out on the real services: PostgreSQL, Redis, two daphne processes, two inference
servers. Skipped, with the reason, where PostgreSQL or Redis is not running."""

import time
import uuid

import pytest

from tests.support.processes import InferenceServer, SiteServer
from tests.support.redis_server import REDIS_URL, require_redis
from tests.support.site_client import SiteClient, collect_reply

pytestmark = [pytest.mark.live, pytest.mark.scaled]

# Site processes behind one proxy share the key that signs their sessions.
SECRET = uuid.uuid4().hex * 2
WORDS = " ".join(f"w{i}" for i in range(50))


@pytest.fixture(scope="module")
def redis_url():
    return require_redis(REDIS_URL)


@pytest.fixture(scope="module")
def replicas(live_dir):
    servers = [
        InferenceServer(live_dir, engine="fake", FAKE_TOKENS_PER_SECOND=25).start()
        for _ in range(2)
    ]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def two_sites(live_dir, postgres_url, redis_url, replicas):
    env = dict(
        DATABASE_URL=postgres_url,
        REDIS_URL=redis_url,
        DJANGO_SECRET_KEY=SECRET,
        INFERENCE_URLS=",".join(r.url for r in replicas),
        CHAT_MAX_STREAMING_PER_USER=50,
        CHAT_MESSAGES_PER_MINUTE=1000,
    )
    first = SiteServer(live_dir, live_dir / "scaled-a", **env).start()
    second = SiteServer(live_dir, live_dir / "scaled-b", **env).start(migrate=False)
    yield first, second
    first.stop()
    second.stop()


def as_user_on(site: SiteServer, client: SiteClient) -> SiteClient:
    """The same signed-in browser talking to another site process (sessions are shared)."""
    other = SiteClient(site.url)
    other.http.cookies = client.http.cookies
    return other


def test_tokens_relayed_by_process_a_reach_a_browser_on_process_b_once_in_order(two_sites):
    site_a, site_b = two_sites
    on_a = SiteClient(site_a.url).signup(f"pg{uuid.uuid4().hex[:6]}")
    on_b = as_user_on(site_b, on_a)
    conversation = on_a.new_conversation()
    stream = on_b.events(conversation["id"])
    try:
        reply_id = on_a.send(conversation["id"], WORDS)["assistant_message"]["id"]
        tokens, end = collect_reply(stream, reply_id)
    finally:
        stream.close()
    assert end.event == "message.end"
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    assert "".join(t["text"] for t in tokens) == WORDS
    saved = on_b.api("GET", f"/api/conversations/{conversation['id']}/").json()["messages"][1]
    assert saved["content"] == WORDS


def test_a_stream_moved_to_another_process_mid_reply_loses_nothing(two_sites):
    site_a, site_b = two_sites
    on_a = SiteClient(site_a.url).signup(f"mv{uuid.uuid4().hex[:6]}")
    on_b = as_user_on(site_b, on_a)
    conversation = on_a.new_conversation()
    first = on_a.events(conversation["id"])
    reply_id = on_b.send(conversation["id"], WORDS)["assistant_message"]["id"]
    before, _ = collect_reply(first, reply_id, stop_after_tokens=8)
    first.close()
    time.sleep(0.3)
    second = on_b.events(conversation["id"], last_event_id=first.last_id)
    try:
        after, end = collect_reply(second, reply_id)
    finally:
        second.close()
    seqs = [t["seq"] for t in before + after]
    assert seqs == list(range(len(seqs)))
    assert "".join(t["text"] for t in before + after) == WORDS
    assert end.event == "message.end"


def test_stop_sent_to_one_process_stops_the_relay_in_the_other(two_sites):
    site_a, site_b = two_sites
    on_a = SiteClient(site_a.url).signup(f"st{uuid.uuid4().hex[:6]}")
    on_b = as_user_on(site_b, on_a)
    conversation = on_a.new_conversation()
    stream = on_a.events(conversation["id"])
    try:
        reply_id = on_a.send(conversation["id"], WORDS * 4)["assistant_message"]["id"]
        collect_reply(stream, reply_id, stop_after_tokens=3)
        assert on_b.api("POST", f"/api/messages/{reply_id}/stop/").status_code == 202
        _, end = collect_reply(stream, reply_id)
    finally:
        stream.close()
    assert end.json["finish_reason"] == "cancelled"


def test_replies_are_spread_over_replicas_and_survive_one_being_killed(
    live_dir, postgres_url, redis_url
):
    replicas = [
        InferenceServer(live_dir, engine="fake", FAKE_TOKENS_PER_SECOND=40).start()
        for _ in range(2)
    ]
    site = SiteServer(
        live_dir,
        live_dir / "scaled-replicas",
        DATABASE_URL=postgres_url,
        DJANGO_SECRET_KEY=SECRET,
        REDIS_URL=redis_url,
        INFERENCE_URLS=",".join(r.url for r in replicas),
        CHAT_MAX_STREAMING_PER_USER=50,
        CHAT_MESSAGES_PER_MINUTE=1000,
    ).start(migrate=False)
    try:
        client = SiteClient(site.url).signup(f"rp{uuid.uuid4().hex[:6]}")

        def reply_to(texts):
            conversations = [client.new_conversation() for _ in texts]
            streams = [client.events(c["id"]) for c in conversations]
            ids = [
                client.send(c["id"], t)["assistant_message"]["id"]
                for c, t in zip(conversations, texts)
            ]
            results = [collect_reply(s, i) for s, i in zip(streams, ids)]
            for s in streams:
                s.close()
            return results

        texts = [" ".join(f"a{n}x{i}" for i in range(20)) for n in range(6)]
        for (tokens, end), text in zip(reply_to(texts), texts):
            assert end.event == "message.end" and "".join(t["text"] for t in tokens) == text
        served = [requests_served(r) for r in replicas]
        assert all(count >= 2 for count in served), f"load not spread: {served}"

        replicas[0].kill()
        texts = [" ".join(f"b{n}x{i}" for i in range(10)) for n in range(4)]
        for (tokens, end), text in zip(reply_to(texts), texts):
            assert end.event == "message.end", end
            assert "".join(t["text"] for t in tokens) == text
    finally:
        site.stop()
        for replica in replicas:
            replica.stop()


def requests_served(server: InferenceServer) -> int:
    """Completed chat requests, from the inference server's Prometheus metrics."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total = 0
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        if family.name.startswith("inference_requests"):
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(total)


def test_a_stream_opened_just_before_sending_misses_nothing(two_sites):
    """Whatever is published after stream-open reaches the stream, also when the stream's
    starting point comes from Redis (a round trip in a thread) and many streams open at once."""
    import concurrent.futures

    site_a, site_b = two_sites
    on_a = SiteClient(site_a.url).signup(f"op{uuid.uuid4().hex[:6]}")

    def open_then_send(attempt: int):
        on_b = as_user_on(site_b, on_a)
        conversation = on_a.new_conversation()
        stream = on_b.events(conversation["id"])  # returns once stream-open is on the wire
        try:
            reply_id = on_a.send(conversation["id"], f"quick {attempt} reply")["assistant_message"][
                "id"
            ]
            kinds, tokens = [], []
            for event in stream:
                if event.json.get("message_id") != reply_id:
                    continue
                kinds.append(event.event)
                if event.event == "token":
                    tokens.append(event.json)
                if event.event in ("message.end", "message.error"):
                    return attempt, kinds, tokens
        finally:
            stream.close()

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(open_then_send, range(20)))
    for attempt, kinds, tokens in results:
        assert kinds[0] == "message.start" and kinds[-1] == "message.end", kinds
        assert "".join(t["text"] for t in tokens) == f"quick {attempt} reply"


def test_the_browser_resumes_on_another_process_after_its_own_dies(
    two_sites, live_dir, postgres_url, redis_url, replicas
):
    site_a, site_b = two_sites
    site_c = SiteServer(
        live_dir,
        live_dir / "scaled-c",
        DATABASE_URL=postgres_url,
        REDIS_URL=redis_url,
        DJANGO_SECRET_KEY=SECRET,
        INFERENCE_URLS=",".join(r.url for r in replicas),
    ).start(migrate=False)
    try:
        on_a = SiteClient(site_a.url).signup(f"rc{uuid.uuid4().hex[:6]}")
        on_b, on_c = as_user_on(site_b, on_a), as_user_on(site_c, on_a)
        conversation = on_a.new_conversation()
        first = on_c.events(conversation["id"])
        reply_id = on_a.send(conversation["id"], WORDS)["assistant_message"]["id"]
        before, _ = collect_reply(first, reply_id, stop_after_tokens=8)
        site_c.kill()  # the process the browser was attached to dies mid-reply
        first.close()
        second = on_b.events(conversation["id"], last_event_id=first.last_id)
        try:
            after, end = collect_reply(second, reply_id)
        finally:
            second.close()
    finally:
        site_c.stop()
    seqs = [t["seq"] for t in before + after]
    assert seqs == list(range(len(seqs)))
    assert "".join(t["text"] for t in before + after) == WORDS
    assert end.event == "message.end"
