"""The site JSON API through Django's test client: shapes, validation, ownership."""

import json
import uuid

import pytest
from django.test import Client

from chat.models import Conversation, Message
from tests.support.api import post
from tests.support.factories import create_conversation, create_message

pytestmark = pytest.mark.django_db


def test_create_conversation_returns_201_with_its_fields(api):
    response = post(api, "/api/conversations/", {"title": "Trip", "system_prompt": "Be brief."})
    assert response.status_code == 201
    data = response.json()
    assert data["title"] == "Trip" and data["system_prompt"] == "Be brief."
    assert Conversation.objects.get(pk=data["id"]).owner.username


def test_list_shows_only_own_conversations_newest_first(api, user):
    older = create_conversation(owner=user, title="older")
    newer = create_conversation(owner=user, title="newer")
    create_conversation(title="someone else's")
    titles = [c["title"] for c in api.get("/api/conversations/").json()["conversations"]]
    assert titles == [newer.title, older.title]


def test_search_finds_conversations_by_title_and_message_text(api, user):
    by_text = create_conversation(owner=user, title="misc")
    create_message(by_text, content="the zebra crossing")
    create_conversation(owner=user, title="Zebra facts")
    create_conversation(owner=user, title="unrelated")
    found = api.get("/api/conversations/?q=zebra").json()["conversations"]
    assert {c["title"] for c in found} == {"misc", "Zebra facts"}


def test_send_stores_question_and_streaming_reply_and_titles_the_conversation(api, user):
    conversation = create_conversation(owner=user)
    response = post(
        api, f"/api/conversations/{conversation.id}/messages/", {"content": "Hi there, model"}
    )
    assert response.status_code == 202
    data = response.json()
    assert data["user_message"]["content"] == "Hi there, model"
    assert data["assistant_message"]["status"] == "streaming"
    assert Message.objects.filter(conversation=conversation).count() == 2
    conversation.refresh_from_db()
    assert conversation.title == "Hi there, model"


def test_send_while_a_reply_streams_is_409(api, user):
    conversation = create_conversation(owner=user)
    create_message(conversation, role="assistant", content="", status="streaming")
    response = post(api, f"/api/conversations/{conversation.id}/messages/", {"content": "again"})
    assert response.status_code == 409
    assert "still being written" in response.json()["error"]["message"]


def test_detail_returns_messages_with_status_and_timings(api, user):
    conversation = create_conversation(owner=user)
    question = create_message(conversation, content="q")
    create_message(
        conversation,
        role="assistant",
        content="a",
        reply_to=question,
        status="complete",
        finish_reason="stop",
        ttft_ms=12,
        duration_ms=500,
        completion_tokens=20,
    )
    data = api.get(f"/api/conversations/{conversation.id}/").json()
    reply = data["messages"][1]
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert reply["finish_reason"] == "stop" and reply["ttft_ms"] == 12
    assert reply["tokens_per_second"] == pytest.approx(19 / 0.488, rel=0.01)


def test_patch_renames_and_changes_settings(api, user):
    conversation = create_conversation(owner=user)
    response = post(
        api,
        f"/api/conversations/{conversation.id}/",
        {"title": "New", "temperature": 0.3, "max_tokens": 100},
        method="patch",
    )
    assert response.status_code == 200
    conversation.refresh_from_db()
    assert (conversation.title, conversation.temperature, conversation.max_tokens) == (
        "New",
        0.3,
        100,
    )


def test_delete_removes_conversation_and_messages(api, user):
    conversation = create_conversation(owner=user)
    create_message(conversation)
    assert api.delete(f"/api/conversations/{conversation.id}/").status_code == 204
    assert not Conversation.objects.exists() and not Message.objects.exists()


def test_regenerate_keeps_the_old_reply_as_a_sibling_and_shows_the_new_one(api, user):
    conversation = create_conversation(owner=user)
    question = create_message(conversation, content="q")
    old = create_message(
        conversation, role="assistant", content="old", reply_to=question, status="failed"
    )
    response = post(api, f"/api/messages/{old.id}/regenerate/", {})
    assert response.status_code == 202
    new = response.json()["assistant_message"]
    assert new["status"] == "streaming" and new["reply_to"] == str(question.id)
    assert new["parent_id"] == str(question.id) and new["siblings"] == [str(old.id), new["id"]]
    visible = [
        m["id"] for m in api.get(f"/api/conversations/{conversation.id}/").json()["messages"]
    ]
    assert visible == [str(question.id), new["id"]]
    assert Message.objects.filter(pk=old.id, content="old").exists()


def test_edit_puts_a_new_question_beside_the_last_one_and_answers_it(api, user):
    conversation = create_conversation(owner=user)
    question = create_message(conversation, content="wrong question")
    create_message(
        conversation, role="assistant", content="a", reply_to=question, status="complete"
    )
    response = post(api, f"/api/messages/{question.id}/edit/", {"content": "right question"})
    assert response.status_code == 202
    visible = api.get(f"/api/conversations/{conversation.id}/").json()["messages"]
    assert [m["content"] for m in visible] == ["right question", ""]
    assert visible[0]["siblings"] == [str(question.id), visible[0]["id"]]


def test_stop_of_a_finished_reply_is_accepted_and_changes_nothing(api, user):
    reply = create_message(create_conversation(owner=user), role="assistant", status="complete")
    assert post(api, f"/api/messages/{reply.id}/stop/", {}).status_code == 202
    reply.refresh_from_db()
    assert reply.status == "complete"


@pytest.mark.parametrize(
    "method,path",
    [
        ("get", "/api/conversations/{c}/"),
        ("patch", "/api/conversations/{c}/"),
        ("delete", "/api/conversations/{c}/"),
        ("post", "/api/conversations/{c}/messages/"),
        ("post", "/api/messages/{m}/stop/"),
        ("post", "/api/messages/{m}/regenerate/"),
        ("post", "/api/messages/{m}/edit/"),
        ("get", "/api/messages/{m}/"),
    ],
)
def test_other_users_and_random_ids_are_404(api, method, path):
    foreign = create_conversation(title="secret")
    foreign_message = create_message(foreign, content="secret words")
    for c, m in [(foreign.id, foreign_message.id), (uuid.uuid4(), uuid.uuid4())]:
        response = post(api, path.format(c=c, m=m), {"content": "x"}, method=method)
        assert response.status_code == 404
        assert "secret" not in response.content.decode()
    assert Message.objects.count() == 1


def test_anonymous_requests_are_401_and_store_nothing():
    client = Client()
    assert client.get("/api/conversations/").status_code == 401
    assert post(client, "/api/conversations/", {}).status_code == 401
    assert not Conversation.objects.exists()


def test_state_changing_requests_need_the_csrf_token(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert post(client, "/api/conversations/", {"title": "x"}).status_code == 403
    client.get("/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/api/conversations/",
        data="{}",
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert response.status_code == 201


BAD_MESSAGE_BODIES = [
    ("", "is required"),
    ("{}", "is required"),
    ('{"content": ""}', "must not be empty"),
    ('{"content": "   \\n "}', "must not be empty"),
    ('{"content": 5}', "must be a string"),
    ('{"content": ["a"]}', "must be a string"),
    ('{"content": null}', "is required"),
    ('{"content": "a\\u0000b"}', "NUL"),
    ('{"content": "\\ud800"}', "valid Unicode"),
    ('{"content": "x", "role": "system"}', "Unknown field"),
    ("[1, 2]", "JSON object"),
    ("not json", "not valid JSON"),
    ('{"content": "x"', "not valid JSON"),
    (b'{"content": "\xff\xfe"}', "UTF-8"),
    ("[" * 100000 + "]" * 100000, "not valid JSON"),
]


@pytest.mark.parametrize("body,why", BAD_MESSAGE_BODIES)
def test_bad_message_bodies_are_400_with_a_reason_and_store_nothing(api, user, body, why):
    conversation = create_conversation(owner=user)
    response = post(api, f"/api/conversations/{conversation.id}/messages/", raw=body)
    assert response.status_code == 400, response.content[:200]
    assert why in response.json()["error"]["message"]
    assert not Message.objects.exists()


def test_too_long_message_is_400_with_the_limit(api, user, settings):
    conversation = create_conversation(owner=user)
    text = "x" * (settings.CHAT_MAX_MESSAGE_CHARS + 1)
    response = post(api, f"/api/conversations/{conversation.id}/messages/", {"content": text})
    assert response.status_code == 400
    assert str(settings.CHAT_MAX_MESSAGE_CHARS) in response.json()["error"]["message"]
    assert not Message.objects.exists()


@pytest.mark.parametrize("size", [1024 * 1024 + 10, 10 * 1024 * 1024])
def test_huge_bodies_are_refused_and_store_nothing(api, user, size):
    conversation = create_conversation(owner=user)
    body = json.dumps({"content": "x" * size})
    response = post(api, f"/api/conversations/{conversation.id}/messages/", raw=body)
    assert response.status_code in (400, 413)
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    "payload",
    [
        {"temperature": "hot"},
        {"temperature": 5},
        {"temperature": float("nan")},
        {"top_p": -1},
        {"max_tokens": 0},
        {"max_tokens": 1.5},
        {"max_tokens": True},
        {"title": 7},
        {"title": "t" * 201},
        {"system_prompt": "s" * 9000},
        {"owner": 1},
    ],
)
def test_bad_conversation_fields_are_400_and_store_nothing(api, payload):
    response = post(api, "/api/conversations/", raw=json.dumps(payload))
    assert response.status_code == 400
    assert response.json()["error"]["message"]
    assert not Conversation.objects.exists()


def test_unicode_oddities_are_kept_exactly(api, user):
    conversation = create_conversation(owner=user)
    text = "שלום \u200f\u200bzero\u200dwidth 👩‍👩‍👧 e\u0301"
    response = post(api, f"/api/conversations/{conversation.id}/messages/", {"content": text})
    assert response.status_code == 202
    assert Message.objects.get(role="user").content == text
