"""A long prompt's progress reaches the page as `message.progress` events, before the first
token and no more often than the relay's interval, through the HTTP client against the fake
engine prefilling at a known pace."""

import asyncio
import time

import pytest

from chat.relay import manager
from chat.streaming import memory_log
from tests.chat.relay.test_manager import published, send_and_relay
from tests.support.factories import create_conversation
from tests.support.processes import slow_reader

pytestmark = pytest.mark.django_db(transaction=True)
WORDS = 1200  # ~0.6 s of prefill at 2,000 words a second: 19 steps of 64 words, ~32 ms each


@pytest.fixture(scope="module")
def slow_prefill(tmp_path_factory):
    with slow_reader(tmp_path_factory.mktemp("relay-prefill"), words_per_second=2000) as server:
        yield server


@pytest.fixture(autouse=True)
def http_client(settings, slow_prefill, fresh_inference_client):
    settings.INFERENCE_CLIENT = "chat.inference_client.http.HttpInferenceClient"
    settings.INFERENCE_URLS = [slow_prefill.url]
    settings.RELAY_FLUSH_INTERVAL = 0.05
    memory_log.forget_all_channels()


def test_a_long_prompt_publishes_its_progress_before_the_first_token():
    conversation = create_conversation(max_tokens=3)
    paste = " ".join(f"w{i}" for i in range(WORDS))
    started = time.monotonic()
    reply = asyncio.run(send_and_relay(conversation, paste))
    took = time.monotonic() - started
    assert reply.status == "complete" and reply.content == "w0 w1 w2"

    events = published(conversation.id)
    kinds = [kind for kind, _ in events]
    first_token = kinds.index("token")
    progress = [data for kind, data in events if kind == "message.progress"]
    assert progress and set(kinds[1:first_token]) == {"message.progress"}
    assert kinds[0] == "message.start" and "message.progress" not in kinds[first_token:]
    assert {p["message_id"] for p in progress} == {str(reply.id)}
    done = [p["processed"] for p in progress]
    assert done == sorted(set(done)) and done[-1] < WORDS
    assert len({p["total"] for p in progress}) == 1 and progress[0]["total"] >= WORDS
    # the server reported every step but the last (18); the relay passed at most one per
    # interval of the time it took
    assert len(progress) <= took / manager.PROGRESS_INTERVAL + 1
    assert len(progress) < WORDS // 64
