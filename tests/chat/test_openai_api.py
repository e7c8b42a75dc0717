"""The site's /v1/chat/completions in this process (the relay with the fake inference
client): the wire format, what is stored, the limits, the errors. The official openai
client against a live site is in test_openai_client_live.py."""

import asyncio
import json

import pytest
from asgiref.sync import ThreadSensitiveContext
from django.test import AsyncClient

from chat import keys
from chat.models import Conversation, Message, UsageDay
from chat.relay.manager import relay_manager
from tests.support.factories import create_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fake_client(settings, fresh_inference_client, monkeypatch):
    settings.INFERENCE_CLIENT = "chat.inference_client.fake.FakeInferenceClient"
    settings.FAKE_TOKENS_PER_SECOND = 0
    settings.RELAY_FLUSH_INTERVAL = 0.05

    # The test database is SQLite in memory with a shared cache, where two connections
    # writing at once fail at once ("table is locked") instead of waiting: keep the
    # sweeper's writes at loop start (orphans, old rate rows) from racing the request's own.
    async def no_sweep():
        return None

    monkeypatch.setattr(relay_manager, "sweep", no_sweep)


@pytest.fixture
def user():
    return create_user()


@pytest.fixture
def secret(user):
    return keys.api_key_create(user=user, name="tests")[1]


def call(secret: str, body, *, raw: bytes | None = None):
    """POST /v1/chat/completions on a loop where the relays run; (status, headers, body):
    the body is the parsed JSON, or for a stream the list of `data:` payloads."""

    async def go():
        relay_manager.ensure_started()
        try:
            # Each request in its own thread context, as daphne gives it (the sync
            # middlewares would otherwise hold the one thread the relay's writes need).
            async with ThreadSensitiveContext():
                response = await AsyncClient().post(
                    "/v1/chat/completions",
                    data=raw if raw is not None else json.dumps(body),
                    content_type="application/json",
                    headers={"Authorization": f"Bearer {secret}"},
                )
                if response.streaming:
                    content = b"".join([part async for part in response.streaming_content])
                    payloads = [line[6:] for line in content.decode().split("\n\n") if line]
                    return response.status_code, response, payloads
                return response.status_code, response, json.loads(response.content)
        finally:
            await relay_manager.aclose()

    return asyncio.run(go())


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "Hello!"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "one two "}, {"type": "text", "text": "three"}],
    },
]


def test_a_non_streaming_call_answers_a_chat_completion(secret):
    status, _, data = call(secret, {"messages": HISTORY})
    assert status == 200
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    [choice] = data["choices"]
    assert choice["message"] == {"role": "assistant", "content": "one two three", "refusal": None}
    assert choice["finish_reason"] == "stop" and data["model"] == "fake-echo"
    usage = data["usage"]
    assert usage["completion_tokens"] == 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + 3


def test_a_streaming_call_sends_openai_chunks_then_usage_then_done(secret):
    status, response, payloads = call(
        secret, {"messages": HISTORY, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert status == 200 and response["Content-Type"] == "text/event-stream"
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three"
    finish, usage = chunks[-2], chunks[-1]
    assert finish["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:-1])


def test_without_include_usage_a_stream_has_no_usage_field(secret):
    _, _, payloads = call(secret, {"messages": HISTORY, "stream": True})
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert (
        all("usage" not in c for c in chunks)
        and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    )


def test_the_call_is_kept_as_an_api_conversation_of_the_user_and_counted(secret, user):
    call(secret, {"messages": HISTORY, "max_tokens": 2, "temperature": 0.3, "model": "fake-echo"})
    conversation = Conversation.objects.get(owner=user)
    assert conversation.source == "api" and conversation.system_prompt == "Be brief."
    assert (conversation.max_tokens, conversation.temperature, conversation.model) == (
        2,
        0.3,
        "fake-echo",
    )
    messages = list(
        conversation.messages.order_by("created_at").values_list("role", "content", "status")
    )
    assert messages == [
        ("user", "hi", "complete"),
        ("assistant", "Hello!", "complete"),
        ("user", "one two three", "complete"),
        ("assistant", "one two", "complete"),
    ]
    row = UsageDay.objects.get(user=user)
    assert (row.source, row.replies, row.completion_tokens) == ("api", 1, 2)


def test_max_tokens_ends_with_length(secret):
    _, _, data = call(secret, {"messages": HISTORY, "max_completion_tokens": 1, "max_tokens": 50})
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["choices"][0]["message"]["content"] == "one"


@pytest.mark.parametrize(
    "body, param",
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            },
            "messages",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "  "}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 3}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
    ],
)
def test_a_bad_body_is_400_naming_the_field(secret, user, body, param):
    status, _, data = call(secret, body)
    assert status == 400
    assert data["error"]["type"] == "invalid_request_error" and data["error"]["param"] == param
    assert not Conversation.objects.filter(owner=user).exists()


def test_a_body_that_is_not_json_is_400(secret):
    status, _, data = call(secret, None, raw=b"{nope")
    assert status == 400 and "not valid JSON" in data["error"]["message"]


def test_unimplemented_openai_fields_are_accepted_and_ignored(secret):
    status, _, data = call(
        secret,
        {
            "messages": HISTORY,
            "user": "u1",
            "seed": 3,
            "stop": ["x"],
            "tools": [],
            "frequency_penalty": 0.5,
        },
    )
    assert status == 200 and data["choices"][0]["message"]["content"] == "one two three"


def test_past_a_quota_a_call_is_429_insufficient_quota(secret, user, settings):
    settings.CHAT_DAILY_TOKEN_QUOTA = 5
    assert call(secret, {"messages": HISTORY})[0] == 200
    status, response, data = call(secret, {"messages": HISTORY})
    assert status == 429
    assert (data["error"]["type"], data["error"]["code"]) == (
        "insufficient_quota",
        "insufficient_quota",
    )
    assert "daily quota of 5 tokens" in data["error"]["message"]
    assert int(response["Retry-After"]) > 0
    assert Conversation.objects.filter(owner=user).count() == 1


def test_the_per_user_stream_limit_applies_to_calls(secret, user, settings):
    settings.CHAT_MAX_STREAMING_PER_USER = 1
    busy = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=busy, role="assistant", status="streaming")
    status, _, data = call(secret, {"messages": HISTORY})
    assert status == 429 and data["error"]["code"] == "rate_limit_exceeded"


def test_a_failure_before_any_text_is_an_http_error_and_counted(secret, user, settings):
    settings.INFERENCE_CLIENT = "chat.inference_client.http.HttpInferenceClient"
    settings.INFERENCE_URLS = ["http://127.0.0.1:9"]
    settings.INFERENCE_BUSY_RETRY_SECONDS = 0
    for stream in (False, True):
        status, _, data = call(secret, {"messages": HISTORY, "stream": stream})
        assert status == 503
        assert (data["error"]["type"], data["error"]["code"]) == (
            "server_error",
            "service_unavailable",
        )
    assert UsageDay.objects.get(user=user).failures == 2


def test_unknown_v1_paths_and_wrong_methods_answer_in_openais_shape(secret):
    from django.test import Client

    client = Client()
    headers = {"Authorization": f"Bearer {secret}"}
    missing = client.get("/v1/completions", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    wrong = client.get("/v1/chat/completions", headers=headers)
    assert wrong.status_code == 405 and "POST" in wrong.json()["error"]["message"]
    model = client.get("/v1/models/fake-echo", headers=headers)
    assert model.json()["id"] == "fake-echo" and model.json()["object"] == "model"
    assert (
        client.get("/v1/models/nope", headers=headers).json()["error"]["code"] == "model_not_found"
    )


def test_a_reply_that_ended_before_its_reader_tapped_it_answers_with_its_model(user):
    """Under load the relay can finish a short reply before the view taps it: the reader
    then gets the end alone, no start, and still names the model that wrote it."""
    from chat.openai_api import ReplyFeed
    from tests.support.factories import create_conversation, create_message

    reply = create_message(create_conversation(owner=user), role="assistant", content="")
    fields = {"status": Message.Status.COMPLETE, "content": "hi", "model": "fake-echo"}
    relay_manager.ended[reply.id] = (0.0, ("end", {"fields": fields, "kind": None}))

    async def read():
        feed = ReplyFeed(reply)
        try:
            return await feed.next(), feed.call().model
        finally:
            feed.close(ended=True)

    (kind, _), model = asyncio.run(read())
    assert kind == "end" and model == "fake-echo"
