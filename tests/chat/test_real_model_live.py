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


def test_a_long_paste_reports_how_much_the_model_has_read_before_its_first_token(real_stack):
    client = SiteClient(real_stack.url).signup("realpaster")
    conversation = client.new_conversation(temperature=0, max_tokens=4)
    paste = " ".join(
        f"Line {i}: the harbour was calm and the boats came in early." for i in range(150)
    )
    stream = client.events(conversation["id"])
    try:
        reply_id = client.send(conversation["id"], paste + "\nHow many lines?")[
            "assistant_message"
        ]["id"]
        seen = []
        for event in stream:
            if event.json.get("message_id") != reply_id:
                continue
            seen.append((event.event, event.json))
            if event.event in ("message.end", "message.error"):
                break
    finally:
        stream.close()
    kinds = [kind for kind, _ in seen]
    assert kinds[-1] == "message.end" and "token" in kinds
    first_token = kinds.index("token")
    progress = [data for kind, data in seen if kind == "message.progress"]
    assert len(progress) >= 2 and set(kinds[1:first_token]) == {"message.progress"}
    done = [p["processed"] for p in progress]
    assert done == sorted(set(done)) and done[-1] < progress[0]["total"]
    # total: the whole prompt as the model's tokenizer counts it (template, system prompt)
    usage = seen[-1][1]["usage"]
    assert {p["total"] for p in progress} == {usage["prompt_tokens"]}
