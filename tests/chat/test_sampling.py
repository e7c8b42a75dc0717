"""The sampling settings against repetition: checked at the API, chosen conversation first,
then preset, then the site's defaults, and sent upstream only when set."""

import json

import pytest
from django.test import Client

from chat.inference_client.http import request_body
from chat.models import Preset
from chat.relay.prompt import build_request, generation_for
from tests.support.factories import create_conversation, create_message, create_user

pytestmark = pytest.mark.django_db

KNOBS = {
    "repetition_penalty": 1.3,
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "top_k": 40,
    "min_p": 0.05,
}


@pytest.fixture
def api():
    client = Client()
    client.force_login(create_user())
    return client


def patch(api, conversation_id, payload):
    return api.patch(
        f"/api/conversations/{conversation_id}/",
        json.dumps(payload),
        content_type="application/json",
    )


def test_a_conversation_saves_and_shows_its_sampling_settings(api):
    conversation = api.post(
        "/api/conversations/", json.dumps(KNOBS), content_type="application/json"
    ).json()
    assert {name: conversation[name] for name in KNOBS} == KNOBS
    cleared = patch(api, conversation["id"], {"top_k": None}).json()
    assert cleared["top_k"] is None and cleared["min_p"] == 0.05


@pytest.mark.parametrize(
    "field, value",
    [
        ("repetition_penalty", 0),
        ("repetition_penalty", 3),
        ("frequency_penalty", 2.5),
        ("presence_penalty", -3),
        ("top_k", 1.5),
        ("top_k", -1),
        ("min_p", 1.5),
        ("min_p", "0.1"),
        ("top_p", 0),
    ],
)
def test_out_of_range_settings_are_a_readable_400_and_nothing_is_saved(api, field, value):
    conversation = api.post("/api/conversations/", "{}", content_type="application/json").json()
    response = patch(api, conversation["id"], {field: value})
    assert response.status_code == 400
    assert f"`{field}`" in response.json()["error"]["message"]
    saved = api.get(f"/api/conversations/{conversation['id']}/").json()
    assert saved[field] == conversation[field]


def test_the_conversation_wins_over_its_preset_which_wins_over_the_site(settings):
    settings.CHAT_DEFAULT_REPETITION_PENALTY = 1.1
    settings.CHAT_DEFAULT_MIN_P = 0.02
    settings.CHAT_DEFAULT_TOP_K = None
    settings.CHAT_DEFAULT_FREQUENCY_PENALTY = None
    preset = Preset.objects.create(name="Poet", repetition_penalty=1.2, top_k=30)
    conversation = create_conversation(preset=preset, repetition_penalty=1.25)
    record = generation_for(conversation)
    assert (record["repetition_penalty"], record["top_k"], record["min_p"]) == (1.25, 30, 0.02)
    assert record["frequency_penalty"] is None


def test_only_the_settings_that_are_set_go_upstream(settings):
    settings.CHAT_DEFAULT_REPETITION_PENALTY = 1.15
    for name in (
        "CHAT_DEFAULT_FREQUENCY_PENALTY",
        "CHAT_DEFAULT_PRESENCE_PENALTY",
        "CHAT_DEFAULT_TOP_K",
        "CHAT_DEFAULT_MIN_P",
    ):
        setattr(settings, name, None)
    conversation = create_conversation(min_p=0.1)
    question = create_message(conversation, content="Write a poem")
    reply = create_message(
        conversation,
        role="assistant",
        content="",
        reply_to=question,
        status="streaming",
        generation=generation_for(conversation),
    )
    body = request_body(build_request(reply))
    assert (body["repetition_penalty"], body["min_p"]) == (1.15, 0.1)
    assert not {"frequency_penalty", "presence_penalty", "top_k"} & set(body)


def test_a_reply_recorded_before_these_settings_sends_none_of_them():
    conversation = create_conversation(repetition_penalty=1.3)
    question = create_message(conversation, content="hi")
    reply = create_message(
        conversation,
        role="assistant",
        content="",
        reply_to=question,
        status="streaming",
        generation={
            "temperature": 0.5,
            "top_p": 0.9,
            "max_tokens": 100,
            "system_prompt": "",
            "preset": None,
        },
    )
    body = request_body(build_request(reply))
    assert "repetition_penalty" in body  # the record lacks it, so today's choice applies
