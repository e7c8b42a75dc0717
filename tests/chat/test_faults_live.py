"""Faults on real processes: the site killed mid-reply, the database locked mid-reply."""

import sqlite3
import threading
import time

import pytest

from tests.live import InferenceServer, SiteClient, SiteServer, collect_reply

pytestmark = pytest.mark.live

WORDS = " ".join(f"w{i}" for i in range(60))


@pytest.fixture
def slow_inference(live_dir):
    server = InferenceServer(live_dir, engine="fake", FAKE_TOKENS_PER_SECOND=20).start()
    yield server
    server.stop()


def reply_state(client, conversation_id, reply_id) -> dict:
    messages = client.api("GET", f"/api/conversations/{conversation_id}/").json()["messages"]
    return next(m for m in messages if m["id"] == reply_id)


def test_site_killed_mid_reply_is_interrupted_with_its_text_after_restart(live_dir, slow_inference):
    var = live_dir / f"killed-site-{slow_inference.port}"
    env = dict(INFERENCE_URLS=slow_inference.url, RELAY_STALE_AFTER=2)
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
        resumed = client.events(conversation["id"], last_event_id=last_id)
        try:
            events = iter(resumed)
            kinds = []
            for event in events:
                kinds.append(event.event)
                if event.event == "message.error":
                    break
        finally:
            resumed.close()
        assert "stream-reset" in kinds, "an id from the dead process must not be replayed"
        assert event.json["message_id"] == reply_id and event.json["retryable"]
        saved = reply_state(client, conversation["id"], reply_id)
        assert saved["status"] == "interrupted"
        assert "restarted" in saved["error"]
        text_seen = "".join(t["text"] for t in seen)
        # Saved at least every half second: what the browser saw, give or take the last flush.
        assert saved["content"] and WORDS.startswith(saved["content"])
        assert len(saved["content"]) >= len(text_seen) - 40
        assert saved["next_seq"] == len(saved["content"].split())

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
        deadline = time.monotonic() + 30
        while (saved := reply_state(client, conversation["id"], reply_id))["status"] == "streaming":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert saved["status"] == "complete"
        assert saved["content"] == text
    finally:
        site.stop()
