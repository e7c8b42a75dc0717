"""Feedback: thumbs up/down and a comment on a reply, changeable, shown back to the user."""

import pytest

from chat.models import Feedback
from tests.support.api import call
from tests.support.factories import create_conversation, create_message

pytestmark = pytest.mark.django_db


@pytest.fixture
def reply(user):
    conversation = create_conversation(owner=user)
    question = create_message(conversation, content="q")
    return create_message(
        conversation, role="assistant", content="a", reply_to=question, status="complete"
    )


def put(api, message, payload=None, raw=None):
    return call(api, "put", f"/api/messages/{message.id}/feedback/", payload, raw=raw)


def test_rate_change_and_clear_feedback(api, reply):
    response = put(api, reply, {"rating": "up", "comment": "  Spot on.  "})
    assert response.status_code == 200
    assert response.json()["feedback"]["rating"] == "up"
    assert response.json()["feedback"]["comment"] == "Spot on."
    shown = api.get(f"/api/conversations/{reply.conversation_id}/").json()["messages"][1]
    assert shown["feedback"]["rating"] == "up"
    changed = put(api, reply, {"rating": "down"}).json()["feedback"]
    assert (changed["rating"], changed["comment"]) == ("down", "")
    only_comment = put(api, reply, {"rating": None, "comment": "unsure"}).json()["feedback"]
    assert (only_comment["rating"], only_comment["comment"]) == (None, "unsure")
    assert put(api, reply, {"rating": None, "comment": ""}).json()["feedback"] is None
    assert not Feedback.objects.exists()


def test_a_user_message_cannot_be_rated(api, reply):
    question = reply.reply_to
    response = put(api, question, {"rating": "up"})
    assert response.status_code == 400 and "reply" in response.json()["error"]["message"]
    assert not Feedback.objects.exists()


def test_a_reply_still_streaming_cannot_be_rated_yet(api, user):
    conversation = create_conversation(owner=user)
    streaming = create_message(conversation, role="assistant", status="streaming")
    assert put(api, streaming, {"rating": "up"}).status_code == 409
    assert not Feedback.objects.exists()


@pytest.mark.parametrize(
    "body,why",
    [
        ("{}", "`rating` is required"),
        ('{"rating": "meh"}', '"up", "down" or null'),
        ('{"rating": 1}', '"up", "down" or null'),
        ('{"rating": "up", "comment": 5}', "must be a string"),
        ('{"rating": "up", "comment": "%s"}' % ("x" * 2001), "too long"),
        ('{"rating": "up", "stars": 5}', "Unknown field"),
        ("not json", "not valid JSON"),
        ('["up"]', "JSON object"),
    ],
)
def test_bad_feedback_is_400_and_stores_nothing(api, reply, body, why):
    response = put(api, reply, raw=body)
    assert response.status_code == 400
    assert why in response.json()["error"]["message"]
    assert not Feedback.objects.exists()


def test_feedback_only_by_put(api, reply):
    assert (
        call(api, "post", f"/api/messages/{reply.id}/feedback/", {"rating": "up"}).status_code
        == 405
    )
