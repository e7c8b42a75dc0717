"""The relay end to end: daphne + `python -m inference` (fake engine) + SSE clients."""

import concurrent.futures
import time

import httpx
import pytest

from tests.support.processes import InferenceServer, SiteServer
from tests.support.site_client import SiteClient, collect_reply

pytestmark = pytest.mark.live

WORDS = " ".join(f"w{i}" for i in range(40))


def test_reply_streams_and_tokens_concatenate_to_saved_content(site_user):
    conversation = site_user.new_conversation()
    stream = site_user.events(conversation["id"])
    try:
        sent = site_user.send(conversation["id"], WORDS)
        reply_id = sent["assistant_message"]["id"]
        assert sent["assistant_message"]["status"] == "streaming"
        tokens, end = collect_reply(stream, reply_id)
    finally:
        stream.close()
    assert end.event == "message.end"
    assert end.json["finish_reason"] == "stop"
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    text = "".join(t["text"] for t in tokens)
    assert text == WORDS
    saved = site_user.message(conversation["id"], reply_id)
    assert saved["content"] == text
    assert saved["status"] == "complete"
    assert saved["next_seq"] == len(tokens)
    assert end.json["ttft_ms"] is not None and end.json["usage"]["completion_tokens"] == 40


def test_reconnect_with_last_event_id_gets_every_token_exactly_once(site_user):
    conversation = site_user.new_conversation()
    first = site_user.events(conversation["id"])
    reply_id = site_user.send(conversation["id"], WORDS)["assistant_message"]["id"]
    before, _ = collect_reply(first, reply_id, stop_after_tokens=5)
    last_id = first.last_id
    first.close()
    time.sleep(0.3)  # tokens keep coming while the client is away
    second = site_user.events(conversation["id"], last_event_id=last_id)
    try:
        after, end = collect_reply(second, reply_id)
    finally:
        second.close()
    seqs = [t["seq"] for t in before + after]
    assert seqs == list(range(len(seqs))), "a token was lost, repeated or reordered"
    assert "".join(t["text"] for t in before + after) == WORDS
    assert end.event == "message.end"


def test_twenty_replies_at_once_all_arrive_complete_and_in_order(make_site_user):
    users = [make_site_user() for _ in range(4)]

    def one_reply(index: int):
        client = users[index % len(users)]
        conversation = client.new_conversation()
        stream = client.events(conversation["id"])
        try:
            text = " ".join(f"r{index}t{i}" for i in range(30))
            reply_id = client.send(conversation["id"], text)["assistant_message"]["id"]
            tokens, end = collect_reply(stream, reply_id)
            return text, tokens, end
        finally:
            stream.close()

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(one_reply, range(20)))
    for text, tokens, end in results:
        assert end.event == "message.end", end
        assert [t["seq"] for t in tokens] == list(range(len(tokens)))
        assert "".join(t["text"] for t in tokens) == text


def test_stop_ends_the_reply_within_a_second_with_partial_text_saved(live_site, make_site_user):
    client = make_site_user()
    conversation = client.new_conversation()
    stream = client.events(conversation["id"])
    try:
        reply_id = client.send(conversation["id"], WORDS * 5)["assistant_message"]["id"]
        before, _ = collect_reply(stream, reply_id, stop_after_tokens=3)
        asked = time.monotonic()
        response = client.api("POST", f"/api/messages/{reply_id}/stop/")
        assert response.status_code == 202
        rest, end = collect_reply(stream, reply_id)
        took = time.monotonic() - asked
    finally:
        stream.close()
    assert end.event == "message.end" and end.json["finish_reason"] == "cancelled"
    assert took < 1.0
    saved = client.message(conversation["id"], reply_id)
    assert saved["status"] == "cancelled"
    assert saved["content"] == "".join(t["text"] for t in before + rest)
    assert 0 < len(saved["content"]) < len(WORDS * 5)


def test_another_user_gets_404_on_the_api_and_is_refused_on_the_event_stream(make_site_user):
    owner, stranger = make_site_user(), make_site_user()
    conversation = owner.new_conversation()
    reply_id = owner.send(conversation["id"], "private words")["assistant_message"]["id"]
    paths = [
        ("GET", f"/api/conversations/{conversation['id']}/"),
        ("PATCH", f"/api/conversations/{conversation['id']}/"),
        ("DELETE", f"/api/conversations/{conversation['id']}/"),
        ("POST", f"/api/conversations/{conversation['id']}/messages/"),
        ("POST", f"/api/messages/{reply_id}/stop/"),
        ("POST", f"/api/messages/{reply_id}/regenerate/"),
        ("GET", f"/api/messages/{reply_id}/"),
    ]
    for method, path in paths:
        response = stranger.api(method, path, {"content": "x"} if method != "GET" else None)
        assert response.status_code == 404, (method, path, response.status_code)
        assert "private" not in response.text
    events = stranger.http.get(f"/events/conversations/{conversation['id']}/")
    assert events.status_code == 404
    anonymous = httpx.get(f"{owner.base_url}/events/conversations/{conversation['id']}/")
    assert anonymous.status_code == 403


@pytest.fixture
def own_stack(live_dir):
    """A site and a slow inference server of this test's own, so killing it harms no other."""
    inference = InferenceServer(live_dir, engine="fake", FAKE_TOKENS_PER_SECOND=10).start()
    site = SiteServer(
        live_dir,
        live_dir / f"var-{inference.port}",
        INFERENCE_URLS=inference.url,
        INFERENCE_BUSY_RETRY_SECONDS=1,
    ).start()
    yield site, inference
    site.stop()
    inference.stop()


def test_inference_killed_mid_reply_gives_message_error_within_5s_and_keeps_text(own_stack):
    site, inference = own_stack
    client = SiteClient(site.url).signup("killer")
    conversation = client.new_conversation()
    stream = client.events(conversation["id"])
    try:
        reply_id = client.send(conversation["id"], WORDS)["assistant_message"]["id"]
        before, _ = collect_reply(stream, reply_id, stop_after_tokens=3)
        inference.kill()
        killed = time.monotonic()
        rest, end = collect_reply(stream, reply_id)
        took = time.monotonic() - killed
    finally:
        stream.close()
    assert end.event == "message.error"
    assert end.json["retryable"] is True
    assert "model server" in end.json["error"]
    assert took < 5
    saved = client.message(conversation["id"], reply_id)
    assert saved["status"] == "failed"
    assert saved["content"] == "".join(t["text"] for t in before + rest)
    assert saved["content"].startswith("w0 w1 w2")

    # Down when the user sends: the question stays, the reply fails with a retryable error.
    second = client.send(conversation["id"], "anyone there")
    time.sleep(0.2)
    reply = client.wait_settled(conversation["id"], second["assistant_message"]["id"], timeout=10)
    assert reply["status"] == "failed" and reply["retryable"]
    assert any(
        m["content"] == "anyone there"
        for m in client.api("GET", f"/api/conversations/{conversation['id']}/").json()["messages"]
    )


def test_stop_pressed_right_after_sending_still_stops_the_reply(make_site_user):
    client = make_site_user()
    conversation = client.new_conversation()
    stream = client.events(conversation["id"])
    try:
        reply_id = client.send(conversation["id"], WORDS * 5)["assistant_message"]["id"]
        assert client.api("POST", f"/api/messages/{reply_id}/stop/").status_code == 202
        tokens, end = collect_reply(stream, reply_id)
    finally:
        stream.close()
    assert end.json["finish_reason"] == "cancelled"
    assert len(tokens) < 20
