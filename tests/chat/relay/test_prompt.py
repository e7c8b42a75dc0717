"""The prompt sent for a reply: history, system prompt, trimming to the context."""

import pytest

from chat import sampling
from chat.models import Preset
from chat.relay.prompt import build_request, estimate_tokens, generation_for, trim_to_budget
from tests.support.factories import create_conversation, create_message


def turn(role, chars):
    return {"role": role, "content": "x" * chars}


def test_trim_keeps_system_prompt_and_newest_turns_within_budget():
    messages = (
        [turn("system", 30)]
        + [turn(r, 300) for r in ["user", "assistant"] * 5]
        + [turn("user", 30)]
    )
    kept = trim_to_budget(messages, budget=400)
    assert kept[0]["role"] == "system"
    assert kept[-1] == messages[-1]
    assert sum(estimate_tokens(m["content"]) for m in kept) <= 400
    assert kept[1]["role"] == "user"


def test_trim_always_keeps_the_question_even_when_it_alone_is_too_long():
    kept = trim_to_budget([turn("user", 10), turn("assistant", 10), turn("user", 9000)], budget=10)
    assert kept == [turn("user", 9000)]


@pytest.mark.django_db
def test_request_carries_history_up_to_the_question_and_conversation_settings(settings):
    settings.INFERENCE_CONTEXT_TOKENS = 4096
    conversation = create_conversation(system_prompt="Be terse.", temperature=0.2, max_tokens=50)
    q1 = create_message(conversation, content="first")
    answer = create_message(
        conversation, role="assistant", content="answer", reply_to=q1, status="complete"
    )
    create_message(conversation, role="assistant", content="other branch", reply_to=q1)
    q2 = create_message(conversation, content="second", parent=answer)
    reply = create_message(
        conversation, role="assistant", content="", reply_to=q2, status="streaming"
    )
    request = build_request(reply)
    assert request.messages == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "second"},
    ]
    assert (request.temperature, request.max_tokens) == (0.2, 50)


@pytest.mark.django_db
def test_unset_sampling_gets_the_site_defaults_and_zero_stays_greedy(settings):
    settings.CHAT_DEFAULT_TEMPERATURE, settings.CHAT_DEFAULT_TOP_P = 0.5, 0.9
    unset = create_conversation()
    question = create_message(unset, content="hi")
    request = build_request(
        create_message(unset, role="assistant", content="", reply_to=question, status="streaming")
    )
    assert (request.temperature, request.top_p) == (0.5, 0.9)
    greedy = create_conversation(temperature=0, top_p=1.0)
    question = create_message(greedy, content="hi")
    request = build_request(
        create_message(greedy, role="assistant", content="", reply_to=question, status="streaming")
    )
    assert (request.temperature, request.top_p) == (0, 1.0)


@pytest.mark.django_db
def test_a_long_history_is_read_newest_first_only_as_far_as_the_context_holds(
    settings, monkeypatch
):
    from chat.models import Message

    settings.INFERENCE_CONTEXT_TOKENS = 2048
    conversation = create_conversation(system_prompt="Be terse.", max_tokens=100)
    question = None
    for number in range(150):
        if question is not None:
            create_message(
                conversation,
                role="assistant",
                content=f"a{number} " + "y" * 600,
                reply_to=question,
                status="complete",
            )
        question = create_message(conversation, content=f"q{number} " + "x" * 600)
    reply = create_message(
        conversation, role="assistant", content="", reply_to=question, status="streaming"
    )
    everything = [{"role": "system", "content": "Be terse."}] + [
        {"role": m.role, "content": m.content}
        for m in conversation.messages.exclude(pk=reply.pk).order_by("created_at")
    ]
    loaded = []
    original = Message.from_db.__func__

    def counting(cls, db, field_names, values):
        loaded.append(1)
        return original(cls, db, field_names, values)

    monkeypatch.setattr(Message, "from_db", classmethod(counting))
    request = build_request(reply)
    assert request.messages == trim_to_budget(everything, 2048 - 100)
    assert len(request.messages) < 15
    assert len(loaded) <= 40, f"{len(loaded)} messages read for a prompt of {len(request.messages)}"


@pytest.mark.django_db
def test_a_reply_is_asked_its_own_path_wherever_the_active_path_is():
    conversation = create_conversation()
    q1 = create_message(conversation, content="old question")
    old_reply = create_message(conversation, role="assistant", content="old answer", reply_to=q1)
    q2 = create_message(conversation, content="follow-up")
    create_message(conversation, content="new question", parent=None)  # an edit of q1
    reply = create_message(
        conversation, role="assistant", content="", reply_to=q2, status="streaming"
    )
    create_message(conversation, content="elsewhere", parent=old_reply)
    assert [m["content"] for m in build_request(reply).messages] == [
        "old question",
        "old answer",
        "follow-up",
    ]


@pytest.mark.django_db
def test_preset_settings_apply_unless_the_conversation_sets_its_own(settings):
    settings.CHAT_DEFAULT_TEMPERATURE, settings.CHAT_DEFAULT_TOP_P = 0.5, 0.9
    preset = Preset.objects.create(
        name="Pirate", system_prompt="Talk like a pirate.", temperature=1.2, max_tokens=40
    )
    conversation = create_conversation(preset=preset, top_p=0.3)
    record = generation_for(conversation)
    assert {k: v for k, v in record.items() if k not in sampling.NAMES} == {
        "preset": {"id": preset.pk, "name": "Pirate"},
        "system_prompt": "Talk like a pirate.",
        "temperature": 1.2,
        "top_p": 0.3,
        "max_tokens": 40,
    }
    own = create_conversation(preset=preset, system_prompt="Be plain.", temperature=0)
    assert (generation_for(own)["system_prompt"], generation_for(own)["temperature"]) == (
        "Be plain.",
        0,
    )


@pytest.mark.django_db
def test_the_request_follows_the_replys_record_not_the_preset_as_it_is_now():
    preset = Preset.objects.create(name="Terse", system_prompt="Be terse.", temperature=0.1)
    conversation = create_conversation(preset=preset)
    question = create_message(conversation, content="hi")
    reply = create_message(
        conversation,
        role="assistant",
        content="",
        reply_to=question,
        status="streaming",
        generation=generation_for(conversation),
    )
    Preset.objects.filter(pk=preset.pk).update(system_prompt="Be verbose.", temperature=1.5)
    reply.refresh_from_db()
    request = build_request(reply)
    assert request.messages[0] == {"role": "system", "content": "Be terse."}
    assert request.temperature == 0.1


@pytest.mark.django_db
def test_the_next_turn_repeats_the_previous_prompt_and_reply_byte_for_byte(settings):
    """The inference server reuses the KV cache of the longest prefix it has seen: a turn's
    prompt must start with the previous turn's prompt and reply, unchanged."""
    settings.INFERENCE_CONTEXT_TOKENS = 8192
    conversation = create_conversation(system_prompt="Be terse.")
    q1 = create_message(conversation, content="  first question, with spaces  \n")
    reply1 = create_message(
        conversation, role="assistant", content="", reply_to=q1, status="streaming"
    )
    first = build_request(reply1).messages
    reply1.content, reply1.status = " streamed text, as it came\n\n", "complete"
    reply1.save()
    q2 = create_message(conversation, content="second")
    second = build_request(
        create_message(conversation, role="assistant", content="", reply_to=q2, status="streaming")
    ).messages
    assert second[: len(first)] == first
    assert second[len(first)] == {"role": "assistant", "content": " streamed text, as it came\n\n"}
