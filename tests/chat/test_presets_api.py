"""Presets: staff prepare them; users list the active ones and start a chat from one."""

import json

import pytest

from chat.models import Conversation, Message, Preset
from chat.relay.prompt import build_request
from tests.support.api import call, finish_replies

pytestmark = pytest.mark.django_db


@pytest.fixture
def pirate():
    return Preset.objects.create(
        name="Pirate",
        description="Arr.",
        system_prompt="Talk like a pirate.",
        temperature=1.1,
        max_tokens=64,
    )


def send(api, conversation_id, text="hello there"):
    response = call(
        api, "post", f"/api/conversations/{conversation_id}/messages/", {"content": text}
    )
    assert response.status_code == 202, response.content
    return response.json()["assistant_message"]


def test_only_active_presets_are_listed(api, pirate):
    Preset.objects.create(name="Retired", is_active=False)
    data = api.get("/api/presets/").json()
    assert data == {
        "presets": [
            {
                "id": pirate.pk,
                "name": "Pirate",
                "description": "Arr.",
                "system_prompt": "Talk like a pirate.",
            }
        ]
    }


def test_a_chat_started_from_a_preset_is_asked_with_its_prompt_and_settings(api, pirate):
    response = call(api, "post", "/api/conversations/", {"preset": pirate.pk})
    assert response.status_code == 201
    conversation = response.json()
    assert conversation["preset"]["name"] == "Pirate" and conversation["system_prompt"] == ""
    reply = send(api, conversation["id"])
    assert reply["preset_name"] == "Pirate"
    request = build_request(Message.objects.select_related("conversation").get(pk=reply["id"]))
    assert request.messages[0] == {"role": "system", "content": "Talk like a pirate."}
    assert (request.temperature, request.max_tokens) == (1.1, 64)


def test_the_conversations_own_system_prompt_overrides_the_presets(api, pirate):
    conversation = call(
        api, "post", "/api/conversations/", {"preset": pirate.pk, "system_prompt": "Be plain."}
    ).json()
    reply = send(api, conversation["id"])
    request = build_request(Message.objects.select_related("conversation").get(pk=reply["id"]))
    assert request.messages[0] == {"role": "system", "content": "Be plain."}
    assert (
        request.temperature == 1.1
    )  # what the conversation does not set still comes from the preset


def test_changing_a_preset_later_keeps_each_replys_record(api, pirate):
    conversation = call(api, "post", "/api/conversations/", {"preset": pirate.pk}).json()
    first = send(api, conversation["id"])
    finish_replies()
    pirate.name, pirate.system_prompt = "Sailor", "Talk like a sailor."
    pirate.save()
    second = send(api, conversation["id"], "again")
    records = {str(m.pk): m.generation for m in Message.objects.filter(role="assistant")}
    assert records[first["id"]]["system_prompt"] == "Talk like a pirate."
    assert records[first["id"]]["preset"]["name"] == "Pirate"
    assert records[second["id"]]["system_prompt"] == "Talk like a sailor."
    assert api.get(f"/api/messages/{first['id']}/").json()["preset_name"] == "Pirate"


def test_patch_changes_or_clears_the_preset(api, user, pirate):
    conversation = call(api, "post", "/api/conversations/", {}).json()
    path = f"/api/conversations/{conversation['id']}/"
    assert call(api, "patch", path, {"preset": pirate.pk}).json()["preset"]["id"] == pirate.pk
    assert call(api, "patch", path, {"preset": None}).json()["preset"] is None


@pytest.mark.parametrize(
    "value,why",
    [
        ("1", "preset id"),
        (True, "preset id"),
        (1.5, "preset id"),
        (0, "preset id"),
        (-3, "preset id"),
        ([1], "preset id"),
        (999999, "not one of the presets"),
        ("retired", "preset id"),
    ],
)
def test_bad_or_unknown_presets_are_400_and_store_nothing(api, pirate, value, why):
    response = call(api, "post", "/api/conversations/", raw=json.dumps({"preset": value}))
    assert response.status_code == 400
    assert why in response.json()["error"]["message"]
    assert not Conversation.objects.exists()


def test_an_inactive_preset_cannot_be_chosen(api, pirate):
    pirate.is_active = False
    pirate.save()
    response = call(api, "post", "/api/conversations/", {"preset": pirate.pk})
    assert response.status_code == 400 and not Conversation.objects.exists()


def test_presets_need_sign_in(client):
    assert client.get("/api/presets/").status_code == 401
