"""Share links: a read-only snapshot of the active path, revocable, revealing nothing else
of the owner."""

import pytest
from django.test import Client

from chat.models import Message, ShareLink
from tests.support.api import call, finish_replies, signed_in
from tests.support.factories import create_conversation, create_message, create_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner():
    return create_user("sharing-owner")


@pytest.fixture
def api(owner):
    return signed_in(owner)


@pytest.fixture
def chat(owner):
    create_conversation(owner=owner, title="My other secret chat")
    conversation = create_conversation(
        owner=owner, title="Shared chat", system_prompt="hidden instructions"
    )
    question = create_message(conversation, content="What is **2+2**?")
    create_message(
        conversation,
        role="assistant",
        content="It is <b>4</b>.",
        reply_to=question,
        status="complete",
    )
    return conversation


def share(api, conversation, payload=None):
    return call(api, "post", f"/api/conversations/{conversation.id}/share/", payload)


def test_share_then_read_as_another_user_a_snapshot_of_the_path(api, chat):
    response = share(api, chat)
    assert response.status_code == 201
    url = response.json()["url"]
    token = url.removeprefix("/s/").strip("/")
    assert url == f"/s/{token}/" and len(token) >= 32
    assert api.get(f"/api/conversations/{chat.id}/").json()["share"]["url"] == url
    # Later messages are not part of the snapshot.
    call(api, "post", f"/api/conversations/{chat.id}/messages/", {"content": "a later question"})
    finish_replies(chat)
    reader = signed_in(create_user())
    page = reader.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "Shared chat" in html and "What is **2+2**?" in html
    assert "a later question" not in html
    for private in ("My other secret chat", "hidden instructions", "sharing-owner", str(chat.id)):
        assert private not in html
    assert "<b>4</b>" not in html  # model text reaches the page only as escaped JSON
    assert page["Cache-Control"] == "no-store" and page["Referrer-Policy"] == "no-referrer"


def test_the_owners_name_shows_only_when_they_agree(api, chat):
    url = share(api, chat, {"show_owner": True}).json()["url"]
    assert "sharing-owner" in signed_in(create_user()).get(url).content.decode()


def test_sharing_again_keeps_the_address_and_moves_the_snapshot(api, chat):
    first = share(api, chat).json()
    call(api, "post", f"/api/conversations/{chat.id}/messages/", {"content": "one more"})
    finish_replies(chat)
    again = share(api, chat)
    assert again.status_code == 200 and again.json()["url"] == first["url"]
    assert "one more" in signed_in(create_user()).get(first["url"]).content.decode()


def test_revoked_and_unknown_links_are_404_and_a_new_share_gets_a_new_address(api, chat):
    url = share(api, chat).json()["url"]
    assert call(api, "delete", f"/api/conversations/{chat.id}/share/").status_code == 204
    reader = signed_in(create_user())
    assert reader.get(url).status_code == 404
    assert api.get(url).status_code == 404  # the owner too
    assert reader.get("/s/not-a-real-token-at-all-xxxxxxxxxx/").status_code == 404
    assert api.get(f"/api/conversations/{chat.id}/").json()["share"] is None
    new_url = share(api, chat).json()["url"]
    assert new_url != url and reader.get(new_url).status_code == 200
    assert reader.get(url).status_code == 404


def test_anonymous_visitors_sign_in_first_unless_shares_are_public(api, chat, settings):
    url = share(api, chat).json()["url"]
    settings.SHARE_PUBLIC = False
    response = Client().get(url)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert Client().get("/s/unknown-token/").status_code == 302  # nothing told about tokens
    settings.SHARE_PUBLIC = True
    assert Client().get(url).status_code == 200
    assert Client().get("/s/unknown-token/").status_code == 404


def test_nothing_to_share_yet_is_400_and_a_streaming_reply_409(api, owner):
    empty = create_conversation(owner=owner)
    assert share(api, empty).status_code == 400
    busy = create_conversation(owner=owner)
    create_message(busy, content="q")
    create_message(busy, role="assistant", status="streaming")
    assert share(api, busy).status_code == 409
    assert not ShareLink.objects.exists()


@pytest.mark.parametrize(
    "body", ['{"show_owner": "yes"}', '{"show_owner": 1}', '{"public": true}', "nope", "[true]"]
)
def test_bad_share_bodies_are_400_and_store_nothing(api, chat, body):
    response = call(api, "post", f"/api/conversations/{chat.id}/share/", raw=body)
    assert response.status_code == 400 and response.json()["error"]["message"]
    assert not ShareLink.objects.exists()


def test_the_share_page_is_read_only(api, chat):
    url = share(api, chat).json()["url"]
    reader = signed_in(create_user())
    assert reader.post(url).status_code in (403, 405)
    assert Message.objects.filter(conversation=chat).count() == 2
