"""Per-user limits through the API: replies and conversations per minute, replies at once,
and the model a conversation may name."""

import pytest

from chat.models import Conversation, Message
from tests.support.api import post
from tests.support.factories import create_conversation, create_message

pytestmark = pytest.mark.django_db


def test_rate_limit_on_messages_per_minute_is_429(api, user, settings):
    settings.CHAT_MESSAGES_PER_MINUTE = 2
    conversations = [create_conversation(owner=user) for _ in range(3)]
    codes = []
    for conversation in conversations:
        Message.objects.filter(status="streaming").update(status="complete")
        codes.append(
            post(
                api, f"/api/conversations/{conversation.id}/messages/", {"content": "hi"}
            ).status_code
        )
    assert codes == [202, 202, 429]


def test_too_many_streaming_replies_is_429(api, user, settings):
    settings.CHAT_MAX_STREAMING_PER_USER = 1
    busy = create_conversation(owner=user)
    create_message(busy, role="assistant", status="streaming")
    other = create_conversation(owner=user)
    response = post(api, f"/api/conversations/{other.id}/messages/", {"content": "hi"})
    assert response.status_code == 429
    assert "too many replies" in response.json()["error"]["message"]


def test_refused_requests_log_nothing_of_another_users_text(api, caplog):
    foreign = create_conversation(title="secret title")
    foreign_message = create_message(foreign, content="secret words")
    caplog.set_level("DEBUG")
    post(api, f"/api/conversations/{foreign.id}/", method="get")
    post(api, f"/api/conversations/{foreign.id}/messages/", {"content": "probe"})
    post(api, f"/api/messages/{foreign_message.id}/edit/", {"content": "probe"})
    post(api, f"/api/conversations/{foreign.id}/", raw="{not json", method="patch")
    assert "secret" not in caplog.text


def finish_streaming_replies():
    Message.objects.filter(status="streaming").update(status="complete")


def test_regenerates_count_against_the_per_minute_limit(api, user, settings):
    settings.CHAT_MESSAGES_PER_MINUTE = 3
    conversation = create_conversation(owner=user)
    question = create_message(conversation, content="q")
    reply = create_message(conversation, role="assistant", content="a", reply_to=question)
    codes = [
        post(api, f"/api/conversations/{conversation.id}/messages/", {"content": "hi"}).status_code
    ]
    for _ in range(3):
        finish_streaming_replies()
        codes.append(post(api, f"/api/messages/{reply.id}/regenerate/", {}).status_code)
    assert codes == [202, 202, 202, 429]
    assert (
        "replies in the last minute"
        in post(api, f"/api/messages/{reply.id}/regenerate/", {}).json()["error"]["message"]
    )


def test_deleting_conversations_does_not_reset_the_per_minute_limit(api, user, settings):
    settings.CHAT_MESSAGES_PER_MINUTE = 2
    codes = []
    for _ in range(3):
        conversation = create_conversation(owner=user)
        codes.append(
            post(
                api, f"/api/conversations/{conversation.id}/messages/", {"content": "hi"}
            ).status_code
        )
        api.delete(f"/api/conversations/{conversation.id}/")
    assert codes == [202, 202, 429]


def test_deleting_a_conversation_stops_its_replies(api, user, monkeypatch):
    from chat.relay.manager import relay_manager

    stopped = []
    monkeypatch.setattr(relay_manager, "request_stop", stopped.append)
    conversation = create_conversation(owner=user)
    reply = post(api, f"/api/conversations/{conversation.id}/messages/", {"content": "hi"}).json()[
        "assistant_message"
    ]
    assert api.delete(f"/api/conversations/{conversation.id}/").status_code == 204
    assert [str(message_id) for message_id in stopped] == [reply["id"]]


def test_conversation_creation_is_limited_per_minute_and_deleting_gives_nothing_back(api, settings):
    settings.CHAT_CONVERSATIONS_PER_MINUTE = 3
    codes = []
    for _ in range(4):
        response = post(api, "/api/conversations/", {"system_prompt": "s" * 8000})
        codes.append(response.status_code)
        if response.status_code == 201:
            api.delete(f"/api/conversations/{response.json()['id']}/")
    assert codes == [201, 201, 201, 429]
    assert (
        "conversations in the last minute"
        in post(api, "/api/conversations/", {}).json()["error"]["message"]
    )


@pytest.fixture
def fake_models(settings, fresh_inference_client, monkeypatch):
    """The in-process fake server, counting how often it is asked for its models."""
    from django.core.cache import cache

    from chat.inference_client.fake import FakeInferenceClient

    settings.INFERENCE_CLIENT = "chat.inference_client.fake.FakeInferenceClient"
    asked = []
    original = FakeInferenceClient.list_models

    async def counted(self):
        asked.append(1)
        return await original(self)

    monkeypatch.setattr(FakeInferenceClient, "list_models", counted)
    cache.clear()
    yield asked
    cache.clear()


def test_a_model_the_servers_do_not_list_is_400_and_the_list_is_asked_once(api, fake_models):
    response = post(api, "/api/conversations/", {"model": "../../admin"})
    assert response.status_code == 400
    assert "fake-echo" in response.json()["error"]["message"]
    assert not Conversation.objects.exists()
    created = post(api, "/api/conversations/", {"model": "fake-echo"})
    assert created.status_code == 201
    patched = post(
        api, f"/api/conversations/{created.json()['id']}/", {"model": "gpt-9"}, method="patch"
    )
    assert patched.status_code == 400
    assert post(api, "/api/conversations/", {"model": ""}).status_code == 201
    assert len(fake_models) == 1


def test_a_model_cannot_be_checked_while_no_server_answers(api, stopped_inference_url):
    from django.core.cache import cache

    cache.clear()
    response = post(api, "/api/conversations/", {"model": "anything"})
    assert response.status_code == 503
    assert "cannot be reached" in response.json()["error"]["message"]
    assert post(api, "/api/conversations/", {"title": "no model asked"}).status_code == 201
