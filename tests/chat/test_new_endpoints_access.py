"""Every endpoint added for branches, feedback and sharing: someone else's conversation or
message, or an id that does not exist, is a 404 that reveals nothing and changes nothing;
without a session, a 401."""

import uuid

import pytest
from django.test import Client

from chat.models import Conversation, Feedback, ShareLink
from tests.support.api import call, signed_in
from tests.support.factories import create_conversation, create_message, create_user

pytestmark = pytest.mark.django_db

ENDPOINTS = [
    ("post", "/api/conversations/{c}/switch/", {"message_id": "{m}"}),
    ("post", "/api/conversations/{c}/share/", {}),
    ("delete", "/api/conversations/{c}/share/", None),
    ("put", "/api/messages/{r}/feedback/", {"rating": "up", "comment": "probe"}),
    ("post", "/api/messages/{r}/regenerate/", {}),
    ("post", "/api/messages/{m}/edit/", {"content": "probe"}),
]


@pytest.fixture
def foreign():
    conversation = create_conversation(title="secret title")
    question = create_message(conversation, content="secret words")
    reply = create_message(
        conversation, role="assistant", content="secret reply", reply_to=question, status="complete"
    )
    ShareLink.objects.create(token="t" * 32, conversation=conversation, leaf=reply)
    return conversation, question, reply


def fill(payload, **ids):
    if payload is None:
        return None
    return {k: v.format(**ids) if isinstance(v, str) else v for k, v in payload.items()}


@pytest.mark.parametrize("method,path,payload", ENDPOINTS)
def test_other_users_and_unknown_ids_are_404(foreign, method, path, payload):
    conversation, question, reply = foreign
    api = signed_in(create_user())
    leaf = conversation.active_leaf_id
    cases = [
        dict(c=conversation.id, m=question.id, r=reply.id),
        dict(c=uuid.uuid4(), m=uuid.uuid4(), r=uuid.uuid4()),
    ]
    for ids in cases:
        response = call(api, method, path.format(**ids), fill(payload, **ids))
        assert response.status_code == 404, (path, response.content)
        assert "secret" not in response.content.decode()
    assert conversation.messages.count() == 2 and not Feedback.objects.exists()
    assert Conversation.objects.get(pk=conversation.pk).active_leaf_id == leaf
    assert ShareLink.objects.get().revoked_at is None


@pytest.mark.parametrize("method,path,payload", ENDPOINTS + [("get", "/api/presets/", None)])
def test_without_a_session_every_new_endpoint_is_401(foreign, method, path, payload):
    conversation, question, reply = foreign
    ids = dict(c=conversation.id, m=question.id, r=reply.id)
    response = call(Client(), method, path.format(**ids), fill(payload, **ids))
    assert response.status_code == 401
