"""The prompt sent for a reply: history, system prompt, trimming to the context."""

import pytest

from chat.relay.prompt import build_request, estimate_tokens, trim_to_budget
from tests.support.factories import create_conversation, create_message


def turn(role, chars):
    return {"role": role, "content": "x" * chars}


def test_trim_keeps_system_prompt_and_newest_turns_within_budget():
    messages = [turn("system", 30)] + [turn(r, 300) for r in ["user", "assistant"] * 5] + [turn("user", 30)]
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
    create_message(conversation, role="assistant", content="answer", reply_to=q1, status="complete")
    create_message(conversation, role="assistant", content="hidden", reply_to=q1, superseded=True)
    q2 = create_message(conversation, content="second")
    reply = create_message(conversation, role="assistant", content="", reply_to=q2, status="streaming")
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
    request = build_request(create_message(unset, role="assistant", content="", reply_to=question, status="streaming"))
    assert (request.temperature, request.top_p) == (0.5, 0.9)
    greedy = create_conversation(temperature=0, top_p=1.0)
    question = create_message(greedy, content="hi")
    request = build_request(create_message(greedy, role="assistant", content="", reply_to=question, status="streaming"))
    assert (request.temperature, request.top_p) == (0, 1.0)


@pytest.mark.django_db
def test_the_next_turn_repeats_the_previous_prompt_and_reply_byte_for_byte(settings):
    """The inference server reuses the KV cache of the longest prefix it has seen: a turn's
    prompt must start with the previous turn's prompt and reply, unchanged."""
    settings.INFERENCE_CONTEXT_TOKENS = 8192
    conversation = create_conversation(system_prompt="Be terse.")
    q1 = create_message(conversation, content="  first question, with spaces  \n")
    reply1 = create_message(conversation, role="assistant", content="", reply_to=q1, status="streaming")
    first = build_request(reply1).messages
    reply1.content, reply1.status = " streamed text, as it came\n\n", "complete"
    reply1.save()
    q2 = create_message(conversation, content="second")
    second = build_request(create_message(conversation, role="assistant", content="", reply_to=q2,
                                          status="streaming")).messages
    assert second[: len(first)] == first
    assert second[len(first)] == {"role": "assistant", "content": " streamed text, as it came\n\n"}
