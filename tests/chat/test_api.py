"""The site JSON API through Django's test client: shapes, validation, ownership."""

import json
import uuid

import pytest
from django.test import Client

from chat.models import Conversation, Message
from tests.support.factories import create_conversation, create_message, create_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def user():
    return create_user()


@pytest.fixture
def api(user):
    client = Client()
    client.force_login(user)
    return client


def post(client, path, payload=None, raw=None, method="post"):
    if method == "get":
        return client.get(path)
    body = raw if raw is not None else json.dumps(payload)
    return getattr(client, method)(path, data=body, content_type="application/json")


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
    response = post(api, f"/api/conversations/{conversation.id}/messages/", {"content": "Hi there, model"})
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
    create_message(conversation, role="assistant", content="a", reply_to=question,
                 status="complete", finish_reason="stop", ttft_ms=12, duration_ms=500,
                 completion_tokens=20)
    data = api.get(f"/api/conversations/{conversation.id}/").json()
    reply = data["messages"][1]
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert reply["finish_reason"] == "stop" and reply["ttft_ms"] == 12
    assert reply["tokens_per_second"] == pytest.approx(19 / 0.488, rel=0.01)


def test_patch_renames_and_changes_settings(api, user):
    conversation = create_conversation(owner=user)
    response = post(api, f"/api/conversations/{conversation.id}/",
                    {"title": "New", "temperature": 0.3, "max_tokens": 100}, method="patch")
    assert response.status_code == 200
    conversation.refresh_from_db()
    assert (conversation.title, conversation.temperature, conversation.max_tokens) == ("New", 0.3, 100)


def test_delete_removes_conversation_and_messages(api, user):
    conversation = create_conversation(owner=user)
    create_message(conversation)
    assert api.delete(f"/api/conversations/{conversation.id}/").status_code == 204
    assert not Conversation.objects.exists() and not Message.objects.exists()


def test_regenerate_keeps_the_old_reply_as_a_sibling_and_shows_the_new_one(api, user):
    conversation = create_conversation(owner=user)
    question = create_message(conversation, content="q")
    old = create_message(conversation, role="assistant", content="old", reply_to=question, status="failed")
    response = post(api, f"/api/messages/{old.id}/regenerate/", {})
    assert response.status_code == 202
    new = response.json()["assistant_message"]
    assert new["status"] == "streaming" and new["reply_to"] == str(question.id)
    assert new["parent_id"] == str(question.id) and new["siblings"] == [str(old.id), new["id"]]
    visible = [m["id"] for m in api.get(f"/api/conversations/{conversation.id}/").json()["messages"]]
    assert visible == [str(question.id), new["id"]]
    assert Message.objects.filter(pk=old.id, content="old").exists()


def test_edit_puts_a_new_question_beside_the_last_one_and_answers_it(api, user):
    conversation = create_conversation(owner=user)
    question = create_message(conversation, content="wrong question")
    create_message(conversation, role="assistant", content="a", reply_to=question, status="complete")
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
    response = client.post("/api/conversations/", data="{}", content_type="application/json",
                           headers={"X-CSRFToken": token})
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


def test_rate_limit_on_messages_per_minute_is_429(api, user, settings):
    settings.CHAT_MESSAGES_PER_MINUTE = 2
    conversations = [create_conversation(owner=user) for _ in range(3)]
    codes = []
    for conversation in conversations:
        Message.objects.filter(status="streaming").update(status="complete")
        codes.append(post(api, f"/api/conversations/{conversation.id}/messages/", {"content": "hi"}).status_code)
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
    codes = [post(api, f"/api/conversations/{conversation.id}/messages/", {"content": "hi"}).status_code]
    for _ in range(3):
        finish_streaming_replies()
        codes.append(post(api, f"/api/messages/{reply.id}/regenerate/", {}).status_code)
    assert codes == [202, 202, 202, 429]
    assert "replies in the last minute" in post(api, f"/api/messages/{reply.id}/regenerate/", {}).json()["error"]["message"]


def test_deleting_conversations_does_not_reset_the_per_minute_limit(api, user, settings):
    settings.CHAT_MESSAGES_PER_MINUTE = 2
    codes = []
    for _ in range(3):
        conversation = create_conversation(owner=user)
        codes.append(post(api, f"/api/conversations/{conversation.id}/messages/", {"content": "hi"}).status_code)
        api.delete(f"/api/conversations/{conversation.id}/")
    assert codes == [202, 202, 429]


def test_deleting_a_conversation_stops_its_replies(api, user, monkeypatch):
    from chat.relay.manager import relay_manager

    stopped = []
    monkeypatch.setattr(relay_manager, "request_stop", stopped.append)
    conversation = create_conversation(owner=user)
    reply = post(api, f"/api/conversations/{conversation.id}/messages/", {"content": "hi"}).json()["assistant_message"]
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
    assert "conversations in the last minute" in post(api, "/api/conversations/", {}).json()["error"]["message"]


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
    patched = post(api, f"/api/conversations/{created.json()['id']}/", {"model": "gpt-9"}, method="patch")
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


def long_conversation(user, count: int):
    conversation = create_conversation(owner=user)
    messages = [create_message(conversation, content=f"m{n}", role="user" if n % 2 == 0 else "assistant")
                for n in range(count)]
    # An older version of the last message: a sibling off the active path, never listed.
    Message.objects.create(conversation=conversation, role=messages[-1].role, content="replaced",
                           parent=messages[-1].parent)
    return conversation, [str(m.id) for m in messages]


def test_a_short_conversation_comes_whole_as_before(api, user):
    conversation, ids = long_conversation(user, 5)
    data = api.get(f"/api/conversations/{conversation.id}/").json()
    assert [m["id"] for m in data["messages"]] == ids
    assert data["has_earlier"] is False and data["earlier_cursor"] is None


def test_a_long_conversation_comes_newest_page_first_with_a_cursor_to_earlier_ones(api, user, settings):
    settings.CHAT_MESSAGES_PAGE_SIZE = 40
    conversation, ids = long_conversation(user, 100)
    url = f"/api/conversations/{conversation.id}/"
    first = api.get(url).json()
    assert [m["id"] for m in first["messages"]] == ids[60:]
    assert first["has_earlier"] is True and first["earlier_cursor"] == ids[60]
    second = api.get(url, {"before": first["earlier_cursor"]}).json()
    assert [m["id"] for m in second["messages"]] == ids[20:60]
    third = api.get(url, {"before": second["earlier_cursor"], "limit": 50}).json()
    assert [m["id"] for m in third["messages"]] == ids[:20]
    assert third["has_earlier"] is False and third["earlier_cursor"] is None
    assert [m["id"] for m in api.get(url, {"limit": 3}).json()["messages"]] == ids[97:]


@pytest.mark.parametrize("query, status", [
    ({"limit": "abc"}, 400), ({"limit": "0"}, 400), ({"limit": "100000"}, 400),
    ({"before": "not-a-uuid"}, 400), ({"before": str(uuid.uuid4())}, 404),
])
def test_bad_page_parameters_are_refused(api, user, query, status):
    conversation, _ = long_conversation(user, 3)
    response = api.get(f"/api/conversations/{conversation.id}/", query)
    assert response.status_code == status
    assert response.json()["error"]["message"]


def test_a_cursor_from_another_users_conversation_is_404(api, user):
    conversation, _ = long_conversation(user, 3)
    _, foreign_ids = long_conversation(create_user(), 3)
    response = api.get(f"/api/conversations/{conversation.id}/", {"before": foreign_ids[1]})
    assert response.status_code == 404
