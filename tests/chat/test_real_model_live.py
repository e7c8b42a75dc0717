"""The whole path with the real bundled model: daphne → relay → python -m inference."""

import pytest

from tests.support.processes import InferenceServer, SiteServer
from tests.support.site_client import SiteClient, collect_reply

pytestmark = [pytest.mark.live, pytest.mark.model]


@pytest.fixture(scope="module")
def real_stack(live_dir):
    inference = InferenceServer(live_dir, engine="transformers", MAX_BATCH=4).start(timeout=600)
    site = SiteServer(live_dir, live_dir / "real-model-var", INFERENCE_URLS=inference.url).start()
    yield site
    site.stop()
    inference.stop()


def test_the_bundled_model_answers_through_the_site_token_by_token(real_stack):
    client = SiteClient(real_stack.url).signup("realuser")
    conversation = client.new_conversation(temperature=0, max_tokens=24)
    stream = client.events(conversation["id"])
    try:
        reply_id = client.send(conversation["id"], "What is the capital of France?")[
            "assistant_message"
        ]["id"]
        tokens, end = collect_reply(stream, reply_id)
    finally:
        stream.close()
    assert end.event == "message.end", end
    text = "".join(t["text"] for t in tokens)
    assert "Paris" in text
    assert len(tokens) > 1, "the reply must arrive in pieces, not at once"
    assert end.json["model"] and end.json["ttft_ms"] > 0
    saved = client.api("GET", f"/api/conversations/{conversation['id']}/").json()["messages"][1]
    assert saved["content"] == text and saved["status"] == "complete"
