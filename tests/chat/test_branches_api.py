"""Branches through the API: editing any question and regenerating any reply make siblings,
switching moves the active path, and each reply is asked its own path."""

import uuid

import pytest

from chat.models import Conversation, Message
from chat.relay.prompt import build_request
from tests.support.api import call, finish_replies
from tests.support.factories import create_conversation, create_message

pytestmark = pytest.mark.django_db


@pytest.fixture
def three_turns(user):
    """q1 a1 q2 a2 q3 a3, every reply complete."""
    conversation = create_conversation(owner=user, title="Three turns")
    made = []
    for n in (1, 2, 3):
        question = create_message(conversation, content=f"question {n}")
        made += [
            question,
            create_message(
                conversation,
                role="assistant",
                content=f"answer {n}",
                reply_to=question,
                status="complete",
            ),
        ]
    return conversation, made


def path_of(api, conversation) -> list[dict]:
    response = api.get(f"/api/conversations/{conversation.id}/")
    assert response.status_code == 200
    return response.json()["messages"]


def contents(messages) -> list[str]:
    return [m["content"] for m in messages]


def test_a_linear_chat_is_one_path_with_parents_and_single_siblings(api, three_turns):
    conversation, made = three_turns
    messages = path_of(api, conversation)
    assert [m["id"] for m in messages] == [str(m.id) for m in made]
    assert [m["parent_id"] for m in messages] == [None] + [str(m.id) for m in made[:-1]]
    assert all(m["siblings"] == [m["id"]] for m in messages)


def test_editing_the_first_question_starts_a_new_branch_beside_it(api, three_turns):
    conversation, made = three_turns
    response = call(
        api, "post", f"/api/messages/{made[0].id}/edit/", {"content": "better question"}
    )
    assert response.status_code == 202
    data = response.json()
    question, reply = data["user_message"], data["assistant_message"]
    assert question["parent_id"] is None and reply["parent_id"] == question["id"]
    assert question["siblings"] == [str(made[0].id), question["id"]]
    messages = path_of(api, conversation)
    assert contents(messages) == ["better question", ""]
    assert messages[0]["siblings"] == [str(made[0].id), question["id"]]
    assert Message.objects.filter(conversation=conversation).count() == 8  # nothing lost
    # The new reply is asked the new question only: not the old branch.
    finish_replies(conversation)
    request = build_request(Message.objects.select_related("conversation").get(pk=reply["id"]))
    assert [m["content"] for m in request.messages] == ["better question"]


def test_switching_shows_a_branch_down_to_its_newest_reply_and_back(api, three_turns):
    conversation, made = three_turns
    edited = call(api, "post", f"/api/messages/{made[0].id}/edit/", {"content": "other"}).json()
    finish_replies(conversation, "other answer")
    response = call(
        api,
        "post",
        f"/api/conversations/{conversation.id}/switch/",
        {"message_id": str(made[0].id)},
    )
    assert response.status_code == 200
    assert contents(response.json()["messages"]) == [m.content for m in made]
    assert contents(path_of(api, conversation)) == [m.content for m in made]
    back = call(
        api,
        "post",
        f"/api/conversations/{conversation.id}/switch/",
        {"message_id": edited["user_message"]["id"]},
    )
    assert contents(back.json()["messages"]) == ["other", "other answer"]


def test_regenerating_a_middle_reply_makes_a_sibling_and_ends_the_path_there(api, three_turns):
    conversation, made = three_turns
    middle = made[3]  # answer 2
    response = call(api, "post", f"/api/messages/{middle.id}/regenerate/", {})
    assert response.status_code == 202
    new = response.json()["assistant_message"]
    assert new["parent_id"] == str(made[2].id)
    assert new["siblings"] == [str(middle.id), new["id"]]
    assert [m["id"] for m in path_of(api, conversation)] == [
        str(made[0].id),
        str(made[1].id),
        str(made[2].id),
        new["id"],
    ]
    finish_replies(conversation)
    # Switching to the old reply brings back the turns that followed it.
    switched = call(
        api, "post", f"/api/conversations/{conversation.id}/switch/", {"message_id": str(middle.id)}
    ).json()
    assert contents(switched["messages"])[-1] == "answer 3"


def test_sending_after_a_switch_continues_the_switched_path(api, three_turns):
    conversation, made = three_turns
    call(api, "post", f"/api/messages/{made[0].id}/edit/", {"content": "other"})
    finish_replies(conversation)
    call(
        api,
        "post",
        f"/api/conversations/{conversation.id}/switch/",
        {"message_id": str(made[0].id)},
    )
    sent = call(api, "post", f"/api/conversations/{conversation.id}/messages/", {"content": "q4"})
    assert sent.status_code == 202
    assert sent.json()["user_message"]["parent_id"] == str(made[-1].id)


def test_only_one_reply_streams_per_conversation_but_switching_is_allowed(api, three_turns):
    conversation, made = three_turns
    edited = call(api, "post", f"/api/messages/{made[2].id}/edit/", {"content": "again"}).json()
    streaming_id = edited["assistant_message"]["id"]
    for path, body in [
        (f"/api/messages/{made[0].id}/edit/", {"content": "x"}),
        (f"/api/messages/{made[1].id}/regenerate/", {}),
        (f"/api/conversations/{conversation.id}/messages/", {"content": "x"}),
    ]:
        response = call(api, "post", path, body)
        assert response.status_code == 409, path
        assert "still being written" in response.json()["error"]["message"]
    switched = call(
        api,
        "post",
        f"/api/conversations/{conversation.id}/switch/",
        {"message_id": str(made[2].id)},
    )
    assert switched.status_code == 200
    data = switched.json()
    # The streaming reply is off the path now, and the conversation says where it is.
    assert streaming_id not in [m["id"] for m in data["messages"]]
    assert data["streaming_reply"]["id"] == streaming_id
    assert Message.objects.get(pk=streaming_id).status == "streaming"


def test_a_message_shows_its_siblings_on_its_own(api, three_turns):
    conversation, made = three_turns
    new = call(api, "post", f"/api/messages/{made[5].id}/regenerate/", {}).json()[
        "assistant_message"
    ]
    data = api.get(f"/api/messages/{made[5].id}/").json()
    assert data["siblings"] == [str(made[5].id), new["id"]]


def test_edit_of_a_reply_and_regenerate_of_a_question_are_400(api, three_turns):
    conversation, made = three_turns
    assert (
        call(api, "post", f"/api/messages/{made[1].id}/edit/", {"content": "x"}).status_code == 400
    )
    assert call(api, "post", f"/api/messages/{made[0].id}/regenerate/", {}).status_code == 400
    assert Message.objects.count() == 6


BAD_SWITCH_BODIES = [
    ("", "is required"),
    ("{}", "is required"),
    ('{"message_id": 5}', "must be a message id"),
    ('{"message_id": "not-a-uuid"}', "must be a message id"),
    ('{"message_id": null}', "is required"),
    ('{"message_id": "%s", "x": 1}', "Unknown field"),
    ("[1]", "JSON object"),
    ("nope", "not valid JSON"),
]


@pytest.mark.parametrize("body,why", BAD_SWITCH_BODIES)
def test_bad_switch_bodies_are_400_and_change_nothing(api, three_turns, body, why):
    conversation, made = three_turns
    leaf = Conversation.objects.get(pk=conversation.pk).active_leaf_id
    raw = body.replace("%s", str(made[0].id))
    response = call(api, "post", f"/api/conversations/{conversation.id}/switch/", raw=raw)
    assert response.status_code == 400
    assert why in response.json()["error"]["message"]
    assert Conversation.objects.get(pk=conversation.pk).active_leaf_id == leaf


def test_switching_to_a_message_of_another_conversation_is_404(api, user, three_turns):
    conversation, made = three_turns
    mine_elsewhere = create_message(create_conversation(owner=user), content="elsewhere")
    foreign = create_message(create_conversation(), content="secret")
    for message_id in (mine_elsewhere.id, foreign.id, uuid.uuid4()):
        response = call(
            api,
            "post",
            f"/api/conversations/{conversation.id}/switch/",
            {"message_id": str(message_id)},
        )
        assert response.status_code == 404
        assert "secret" not in response.content.decode()


@pytest.mark.parametrize(
    "body", ['{"content": ""}', '{"content": 3}', "{}", '{"content": "x", "parent": 1}']
)
def test_bad_edit_bodies_are_400_and_store_nothing(api, three_turns, body):
    conversation, made = three_turns
    response = call(api, "post", f"/api/messages/{made[2].id}/edit/", raw=body)
    assert response.status_code == 400 and response.json()["error"]["message"]
    assert Message.objects.count() == 6
