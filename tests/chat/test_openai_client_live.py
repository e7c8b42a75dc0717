"""The official `openai` Python client against the live site (daphne + the fake inference
server), with a user's API key: streaming and not, usage, models, errors, and what the
site keeps of each call."""

import threading
import time

import openai
import pytest

from tests.support.factories import unique_name
from tests.support.site_client import SiteClient

pytestmark = pytest.mark.live

HISTORY = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Say hello"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "now repeat these six words please"},
]
WORDS = "now repeat these six words please"


@pytest.fixture
def user(live_site) -> SiteClient:
    return SiteClient(live_site.url).signup(unique_name("oai"))


def new_key(user: SiteClient) -> str:
    response = user.api("POST", "/api/keys/", {"name": "tests"})
    assert response.status_code == 201, response.text
    return response.json()["key"]


@pytest.fixture
def client(live_site, user) -> openai.OpenAI:
    # No retries: the site's own 429s and 5xx are what these tests look at.
    return openai.OpenAI(
        base_url=f"{live_site.url}/v1", api_key=new_key(user), max_retries=0, timeout=30
    )


def set_quota(live_site, username: str, daily: int) -> None:
    live_site.manage(
        "shell",
        "-c",
        (
            "from django.contrib.auth import get_user_model; from chat.models import TokenQuota; "
            f"u = get_user_model().objects.get(username={username!r}); "
            f"TokenQuota.objects.update_or_create(user=u, defaults={{'daily_tokens': {daily}}})"
        ),
    )


def test_models_lists_the_inference_servers_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake"]
    assert models.data[0].object == "model"
    assert client.models.retrieve("fake").id == "fake"


def test_a_completion_without_streaming(client):
    completion = client.chat.completions.create(model="fake", messages=HISTORY)
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.model == "fake"
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == WORDS
    assert choice.finish_reason == "stop"
    usage = completion.usage
    assert usage.completion_tokens == 6 and usage.prompt_tokens > 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_streamed_completion_with_usage(client):
    stream = client.chat.completions.create(
        model="fake", messages=HISTORY, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == WORDS
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert len({c.id for c in chunks}) == 1


def test_max_tokens_and_the_length_finish(client):
    completion = client.chat.completions.create(model="fake", messages=HISTORY, max_tokens=2)
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "now repeat"


def test_calls_are_conversations_of_the_user_and_add_to_their_usage(client, user):
    before = user.api("GET", "/api/usage/").json()["today"]
    completion = client.chat.completions.create(model="fake", messages=HISTORY)
    after = user.api("GET", "/api/usage/").json()["today"]
    assert after["replies"] == before["replies"] + 1
    assert after["total_tokens"] == before["total_tokens"] + completion.usage.total_tokens
    listed = user.api("GET", "/api/conversations/").json()["conversations"]
    mine = next(c for c in listed if c["source"] == "api")
    detail = user.api("GET", f"/api/conversations/{mine['id']}/").json()
    assert detail["system_prompt"] == "Answer briefly."
    assert [m["content"] for m in detail["messages"]] == ["Say hello", "Hello!", WORDS, WORDS]


def test_a_bad_key_is_an_authentication_error(live_site):
    bad = openai.OpenAI(base_url=f"{live_site.url}/v1", api_key="ts-not-a-real-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model="fake", messages=HISTORY)
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"


def test_a_revoked_key_stops_working_at_once(live_site, user):
    secret = new_key(user)
    key_id = user.api("GET", "/api/keys/").json()["keys"][0]["id"]
    client = openai.OpenAI(base_url=f"{live_site.url}/v1", api_key=secret, max_retries=0)
    assert client.models.list().data
    assert user.api("DELETE", f"/api/keys/{key_id}/").status_code == 204
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_a_bad_request_is_a_bad_request_error_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="fake", messages=HISTORY, temperature=5)
    assert caught.value.param == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake", messages=[])


def test_an_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=HISTORY)
    assert caught.value.code == "model_not_found"


def test_past_the_quota_a_call_is_a_rate_limit_error_saying_when_it_resets(live_site, user, client):
    client.chat.completions.create(model="fake", messages=HISTORY)
    username = user.http.get("/").text.split('data-user="', 1)[1].split('"', 1)[0]
    set_quota(live_site, username, 1)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="fake", messages=HISTORY, stream=True)
    error = caught.value
    assert error.status_code == 429 and error.code == "insufficient_quota"
    assert "daily quota of 1 token" in error.message and "resets at" in error.message
    assert int(error.response.headers["retry-after"]) > 0
    # The page is refused the same way.
    conversation = user.new_conversation()
    refused = user.api(
        "POST", f"/api/conversations/{conversation['id']}/messages/", {"content": "hi"}
    )
    assert refused.status_code == 429


def test_a_caller_that_goes_away_mid_stream_stops_the_reply(client, user):
    long = " ".join(f"w{i}" for i in range(300))  # six seconds at the fake's 50 tokens/s
    stream = client.chat.completions.create(
        model="fake", stream=True, messages=[{"role": "user", "content": long}]
    )
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received >= 3:
            break
    stream.close()
    deadline = time.monotonic() + 15
    while True:
        listed = user.api("GET", "/api/conversations/").json()["conversations"]
        detail = user.api("GET", f"/api/conversations/{listed[0]['id']}/").json()
        reply = detail["messages"][-1]
        if reply["status"] != "streaming" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert reply["status"] == "cancelled"
    assert 3 <= len(reply["content"].split()) < 300


def test_concurrent_calls_stream_independently(client):
    results: dict[int, str] = {}

    def one(n: int) -> None:
        words = " ".join(f"c{n}w{i}" for i in range(8))
        stream = client.chat.completions.create(
            model="fake", stream=True, messages=[{"role": "user", "content": words}]
        )
        results[n] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {n: " ".join(f"c{n}w{i}" for i in range(8)) for n in range(6)}
