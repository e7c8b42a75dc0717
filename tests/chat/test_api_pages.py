"""A long conversation through the API, a page of its path at a time."""

import uuid

import pytest

from chat.models import Message
from tests.support.factories import create_conversation, create_message, create_user

pytestmark = pytest.mark.django_db


def long_conversation(user, count: int):
    conversation = create_conversation(owner=user)
    messages = [
        create_message(conversation, content=f"m{n}", role="user" if n % 2 == 0 else "assistant")
        for n in range(count)
    ]
    # An older version of the last message: a sibling off the active path, never listed.
    Message.objects.create(
        conversation=conversation,
        role=messages[-1].role,
        content="replaced",
        parent=messages[-1].parent,
    )
    return conversation, [str(m.id) for m in messages]


def test_a_short_conversation_comes_whole_as_before(api, user):
    conversation, ids = long_conversation(user, 5)
    data = api.get(f"/api/conversations/{conversation.id}/").json()
    assert [m["id"] for m in data["messages"]] == ids
    assert data["has_earlier"] is False and data["earlier_cursor"] is None


def test_a_long_conversation_comes_newest_page_first_with_a_cursor_to_earlier_ones(
    api, user, settings
):
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


@pytest.mark.parametrize(
    "query, status",
    [
        ({"limit": "abc"}, 400),
        ({"limit": "0"}, 400),
        ({"limit": "100000"}, 400),
        ({"before": "not-a-uuid"}, 400),
        ({"before": str(uuid.uuid4())}, 404),
    ],
)
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
