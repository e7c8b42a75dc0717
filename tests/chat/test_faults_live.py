"""Faults on real processes: the site killed mid-reply, the database locked mid-reply."""

import sqlite3
import threading
import time

import pytest

from tests.support.processes import InferenceServer, SiteServer
from tests.support.site_client import SiteClient, collect_reply

pytestmark = pytest.mark.live

WORDS = " ".join(f"w{i}" for i in range(60))


@pytest.fixture
def slow_inference(live_dir):
    server = InferenceServer(live_dir, engine="fake", FAKE_TOKENS_PER_SECOND=20).start()
    yield server
    server.stop()


def test_site_killed_mid_reply_is_interrupted_with_its_text_after_restart(live_dir, slow_inference):
    var = live_dir / f"killed-site-{slow_inference.port}"
    # The restarted site's first sweep runs at its first request, before the stream below
    # can open: the reply must not be stale yet then, or its message.error goes out before
    # anyone listens. Two seconds was less than a restart takes on a loaded machine; with
    # six, the sweep five seconds later marks it, with the stream open.
    env = dict(INFERENCE_URLS=slow_inference.url, RELAY_STALE_AFTER=6)
    site = SiteServer(live_dir, var, **env).start()
    client = SiteClient(site.url).signup("victim")
    conversation = client.new_conversation()
    stream = client.events(conversation["id"])
    reply_id = client.send(conversation["id"], WORDS)["assistant_message"]["id"]
    seen, _ = collect_reply(stream, reply_id, stop_after_tokens=15)
    last_id = stream.last_id
    stream.close()
    site.kill()

    restarted = SiteServer(live_dir, var, port=site.port, **env).start(migrate=False)
    try:
        # The new process does not know the old ids: stream-reset, and the page reloads the
        # message from the API. Whether the sweep that marks the reply `interrupted` runs
        # before or after this reconnect is a race, so the test reads the outcome from the
        # API, as the page does after a reset (a message.error may or may not come first).
        resumed = client.events(conversation["id"], last_event_id=last_id)
        try:
            first = next(event for event in resumed if event.event != "stream-open")
        finally:
            resumed.close()
        assert first.event == "stream-reset", "an id from the dead process must not be replayed"
        saved = client.wait_settled(conversation["id"], reply_id, timeout=30)
        assert (saved["status"], saved["retryable"]) == ("interrupted", True)
        assert "restarted" in saved["error"]
        text_seen = "".join(t["text"] for t in seen)
        # Saved at least every half second: what the browser saw, give or take the last flush.
        assert saved["content"] and WORDS.startswith(saved["content"])
        assert len(saved["content"]) >= len(text_seen) - 40
        # next_seq counts token events (tokens that arrive together share one event): the
        # saved text is exactly the text of the events before it.
        if saved["next_seq"] <= len(seen):
            assert saved["content"] == "".join(t["text"] for t in seen[: saved["next_seq"]])
        else:
            assert saved["content"].startswith(text_seen)

        retry = client.api("POST", f"/api/messages/{reply_id}/regenerate/")
        assert retry.status_code == 202
    finally:
        restarted.stop()


def test_database_locked_mid_reply_loses_no_text(live_dir, slow_inference):
    var = live_dir / f"locked-db-{slow_inference.port}"
    site = SiteServer(live_dir, var, INFERENCE_URLS=slow_inference.url).start()
    try:
        client = SiteClient(site.url).signup("locked")
        conversation = client.new_conversation()
        stream = client.events(conversation["id"])
        text = " ".join(f"x{i}" for i in range(40))
        reply_id = client.send(conversation["id"], text)["assistant_message"]["id"]
        collect_reply(stream, reply_id, stop_after_tokens=5)

        def hold_lock():
            db = sqlite3.connect(var / "db.sqlite3", timeout=30)
            db.execute("BEGIN EXCLUSIVE")
            time.sleep(3)  # flushes in this window fail and are retried
            db.rollback()
            db.close()

        locker = threading.Thread(target=hold_lock)
        locker.start()
        tokens, end = collect_reply(stream, reply_id)
        locker.join()
        stream.close()
        assert end.event == "message.end"
        saved = client.wait_settled(conversation["id"], reply_id)
        assert saved["status"] == "complete"
        assert saved["content"] == text
    finally:
        site.stop()


def test_browser_connection_cut_mid_reply_then_resumed_gets_every_token_once(
    live_site, make_site_user
):
    from tests.support.tcp_proxy import CuttableProxy

    proxy = CuttableProxy(live_site.port)
    try:
        direct = make_site_user()
        through_proxy = SiteClient(proxy.url)
        through_proxy.http.cookies = direct.http.cookies
        conversation = direct.new_conversation()
        stream = through_proxy.events(conversation["id"])
        reply_id = direct.send(conversation["id"], WORDS)["assistant_message"]["id"]
        before, _ = collect_reply(stream, reply_id, stop_after_tokens=6)
        proxy.cut()
        # Whatever the client library raises for a cut connection: the test is what follows.
        with pytest.raises(Exception):  # noqa: B017
            collect_reply(stream, reply_id)  # the connection is gone
        stream.close()
        time.sleep(0.5)
        resumed = through_proxy.events(conversation["id"], last_event_id=stream.last_id)
        try:
            after, end = collect_reply(resumed, reply_id)
        finally:
            resumed.close()
    finally:
        proxy.close()
    seqs = [t["seq"] for t in before + after]
    assert seqs == sorted(set(seqs)) == list(range(len(seqs)))
    assert "".join(t["text"] for t in before + after) == WORDS
    assert end.event == "message.end"


def metrics_value(site_url: str, name: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{site_url}/metrics", headers={"Authorization": "Bearer m-token"}).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize(
    "behaviour,expected",
    [
        ("silent", "stopped answering"),
        ("stall", "stopped answering"),
        ("503", "busy"),
        ("drop", "lost"),
        ("error_chunk", "CUDA fell over"),
    ],
)
def test_inference_failures_end_the_reply_clearly_and_leave_no_relay_running(
    live_dir, behaviour, expected
):
    from tests.support.scripted_server import ScriptedServer

    with ScriptedServer([behaviour] * 20) as upstream:
        site = SiteServer(
            live_dir,
            live_dir / f"scripted-{behaviour}",
            INFERENCE_URLS=upstream.url,
            INFERENCE_FIRST_TOKEN_TIMEOUT=2,
            INFERENCE_READ_TIMEOUT=2,
            INFERENCE_BUSY_RETRY_SECONDS=2,
            METRICS_TOKEN="m-token",
        ).start()
        try:
            client = SiteClient(site.url).signup(f"f{behaviour.replace('_', '')}")
            conversation = client.new_conversation()
            stream = client.events(conversation["id"])
            started = time.monotonic()
            reply_id = client.send(conversation["id"], "hello")["assistant_message"]["id"]
            tokens, end = collect_reply(stream, reply_id)
            took = time.monotonic() - started
            stream.close()
            saved = client.wait_settled(conversation["id"], reply_id)
            assert end.event == "message.error"
            assert expected in end.json["error"] and end.json["retryable"] is True
            assert took < 10
            assert saved["status"] == "failed" and saved["content"] == "".join(
                t["text"] for t in tokens
            )
            assert metrics_value(site.url, "tokenstream_relays_active") == 0
            deadline = time.monotonic() + 5
            while upstream.open_streams and time.monotonic() < deadline:
                time.sleep(0.1)
            assert upstream.open_streams == 0, "the upstream connection was left open"
        finally:
            site.stop()


def test_overloaded_inference_server_is_reported_busy_and_no_reply_is_left_streaming(live_dir):
    inference = InferenceServer(
        live_dir, engine="fake", FAKE_TOKENS_PER_SECOND=10, MAX_BATCH=1, MAX_QUEUE=0
    ).start()
    site = SiteServer(
        live_dir,
        live_dir / "overloaded",
        INFERENCE_URLS=inference.url,
        INFERENCE_BUSY_RETRY_SECONDS=1,
    ).start()
    try:
        client = SiteClient(site.url).signup("busyuser")
        first, second = client.new_conversation(), client.new_conversation()
        long_id = client.send(first["id"], WORDS)["assistant_message"]["id"]
        time.sleep(0.3)
        stream = client.events(second["id"])
        busy_id = client.send(second["id"], "me too")["assistant_message"]["id"]
        _, end = collect_reply(stream, busy_id)
        stream.close()
        assert end.event == "message.error" and "busy" in end.json["error"]
        assert client.wait_settled(second["id"], busy_id)["status"] == "failed"
        assert client.wait_settled(first["id"], long_id)["status"] == "complete"
        retry = client.api("POST", f"/api/messages/{busy_id}/regenerate/").json()[
            "assistant_message"
        ]
        assert client.wait_settled(second["id"], retry["id"])["status"] == "complete"
    finally:
        site.stop()
        inference.stop()
