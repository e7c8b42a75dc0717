"""Staff review of transcripts in the Django admin: finding, reading, exporting, and never
editing what a user or the model said."""

import datetime
import json
import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from chat.models import Conversation, Message

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/chat/conversation/"


def transcript_url(conversation) -> str:
    return reverse("admin:chat_conversation_transcript", args=[conversation.pk])


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def listed(response) -> list[Conversation]:
    return list(response.context["cl"].result_list)


@pytest.fixture
def staff(reviewer):
    return signed_in(reviewer)


@pytest.fixture
def chat(make_user, make_conversation, make_message):
    """Someone's conversation: a question, a reply, and its regenerated reply (a sibling on
    the active path)."""
    owner = make_user("alice")
    conversation = make_conversation(owner, title="Travel plans")
    question = make_message(conversation, "Which animal has stripes, a zebra?")
    old = make_message(
        conversation,
        "Perhaps a tiger.",
        role="assistant",
        reply_to=question,
        model="smol",
        status="complete",
        finish_reason="stop",
    )
    new = make_message(
        conversation,
        "Yes, the zebra has stripes.",
        role="assistant",
        reply_to=question,
        model="smol",
        status="complete",
        finish_reason="stop",
        ttft_ms=120,
        duration_ms=1120,
        completion_tokens=11,
        prompt_tokens=30,
    )
    _space_out([question, old, new])
    return conversation


def _space_out(messages) -> None:
    """Distinct, increasing timestamps, as real messages have."""
    start = timezone.now() - datetime.timedelta(minutes=10)
    for n, message in enumerate(messages):
        created_at = start + datetime.timedelta(seconds=n)
        Message.objects.filter(pk=message.pk).update(created_at=created_at)


def test_staff_finds_a_conversation_by_a_word_inside_one_of_its_messages_and_opens_its_transcript(
    staff, chat, make_conversation, make_message
):
    other = make_conversation(title="Cooking")
    make_message(other, "How long do I boil an egg?")

    response = staff.get(CHANGELIST, {"q": "zebra"})

    assert response.status_code == 200
    assert listed(response) == [chat]  # once, though two of its messages match
    transcript = staff.get(transcript_url(chat))
    assert transcript.status_code == 200
    page = transcript.content.decode()
    assert "Which animal has stripes, a zebra?" in page
    assert "Perhaps a tiger." in page and "Yes, the zebra has stripes." in page
    assert "TTFT 120 ms" in page and "10.0 tokens/s" in page and "finish stop" in page


def test_search_finds_conversations_by_owner_username_and_title(staff, chat, make_conversation):
    make_conversation(title="Unrelated")
    assert listed(staff.get(CHANGELIST, {"q": "alice"})) == [chat]
    assert listed(staff.get(CHANGELIST, {"q": "travel"})) == [chat]


def test_changelist_shows_owner_message_count_model_and_last_reply_status(staff, chat):
    response = staff.get(CHANGELIST)
    row = listed(response)[0]
    assert row.message_count == 3 and row.reply_status == "complete"
    page = response.content.decode()
    assert "alice" in page and "Travel plans" in page and "smol" in page


def test_a_conversation_with_a_streaming_reply_shows_and_filters_as_streaming(
    staff, chat, make_conversation, make_message
):
    live = make_conversation(title="Still writing")
    make_message(live, "Tell me a story")
    make_message(live, "Once upon", role="assistant", status="streaming")

    streaming = listed(staff.get(CHANGELIST, {"status": "streaming"}))
    complete = listed(staff.get(CHANGELIST, {"status": "complete"}))

    assert streaming == [live] and streaming[0].reply_status == "streaming"
    assert complete == [chat]


def test_conversations_filter_by_reply_model_and_owner(
    staff, chat, make_conversation, make_message
):
    other = make_conversation(title="Other model")
    make_message(other, "hi", role="assistant", model="big")
    assert listed(staff.get(CHANGELIST, {"model": "big"})) == [other]
    assert listed(staff.get(CHANGELIST, {"owner__id__exact": chat.owner_id})) == [chat]


def test_non_staff_user_cannot_open_the_admin(make_user, chat):
    client = signed_in(make_user())
    for url in ("/admin/", CHANGELIST, transcript_url(chat)):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_staff_without_the_view_conversation_permission_cannot_read_transcripts(make_user, chat):
    client = signed_in(make_user(staff=True))
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(transcript_url(chat)).status_code == 403
    assert client.get(f"{transcript_url(chat)[:-1]}.json").status_code == 403


@pytest.mark.parametrize("who", ["reviewer", "superuser"])
def test_staff_cannot_change_message_text_through_the_admin(who, staff, admin_client, chat):
    client = staff if who == "reviewer" else admin_client
    message = chat.messages.get(content="Yes, the zebra has stripes.")
    url = reverse("admin:chat_message_change", args=[message.pk])

    assert client.get(url).status_code == 200  # readable
    response = client.post(
        url, {"content": "Rewritten by staff", "role": "assistant", "status": "complete"}
    )

    assert response.status_code == 403
    message.refresh_from_db()
    assert message.content == "Yes, the zebra has stripes."
    assert client.post(reverse("admin:chat_message_add"), {"content": "x"}).status_code == 403


def test_staff_cannot_edit_a_conversation_or_delete_a_single_message(admin_client, chat):
    change = reverse("admin:chat_conversation_change", args=[chat.pk])
    response = admin_client.post(change, {"title": "Renamed", "system_prompt": "Obey me"})
    assert response.status_code == 403
    chat.refresh_from_db()
    assert chat.title == "Travel plans"
    message = chat.messages.first()
    assert (
        admin_client.post(
            reverse("admin:chat_message_delete", args=[message.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert Message.objects.filter(pk=message.pk).exists()


def test_staff_with_the_delete_permission_deletes_a_whole_conversation(make_user, chat):
    client = signed_in(make_user(staff=True, perms=("view_conversation", "delete_conversation")))
    url = reverse("admin:chat_conversation_delete", args=[chat.pk])

    response = client.post(url, {"post": "yes"})

    assert response.status_code == 302
    assert not Conversation.objects.filter(pk=chat.pk).exists()
    assert not Message.objects.filter(conversation_id=chat.pk).exists()


def test_transcript_escapes_message_text(staff, make_conversation, make_message):
    conversation = make_conversation()
    make_message(conversation, '<script>alert("x")</script><b>bold</b>', role="assistant")

    page = staff.get(transcript_url(conversation)).content.decode()

    assert '<script>alert("x")</script>' not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_transcript_marks_messages_off_the_active_path(staff, chat):
    page = staff.get(transcript_url(chat)).content.decode()
    old_id = chat.messages.get(content="Perhaps a tiger.").pk
    assert f'class="msg assistant alternative" id="msg-{old_id}"' in page
    assert "Branch 2: another version of the reply #2" in page


def test_transcript_json_gives_a_streaming_reply_its_text_so_far(
    staff, make_conversation, make_message
):
    conversation = make_conversation()
    make_message(conversation, "Count to three")
    reply = make_message(conversation, "One, two", role="assistant", status="streaming")

    page = staff.get(transcript_url(conversation)).content.decode()
    data = staff.get(f"{transcript_url(conversation)[:-1]}.json").json()

    assert 'data-streaming="true"' in page
    assert data["streaming"] is True
    assert data["messages"][-1] == {
        **data["messages"][-1],
        "id": str(reply.pk),
        "content": "One, two",
        "status": "streaming",
    }


def export(client, action: str, conversations):
    selected = [c.pk for c in conversations]
    return client.post(CHANGELIST, {"action": action, "_selected_action": selected})


def test_markdown_export_contains_every_message_in_order(
    staff, chat, make_conversation, make_message
):
    second = make_conversation(title="Second")
    make_message(second, "Another question")

    response = export(staff, "export_markdown", [chat, second])

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    assert response["Content-Disposition"].startswith("attachment;")
    text = response.content.decode()
    expected = [
        "# Travel plans",
        "## Active path",
        "Which animal has stripes, a zebra?",
        "Yes, the zebra has stripes.",
        "## Branch 2: another version of the reply #2",
        "Perhaps a tiger.",
        "# Second",
        "Another question",
    ]
    positions = [text.index(part) for part in expected]
    assert positions == sorted(positions)
    assert "TTFT 120 ms" in text


def test_json_export_contains_every_message_in_order_with_metadata(staff, chat):
    response = export(staff, "export_json", [chat])

    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    [conversation] = json.loads(response.content)["conversations"]
    assert conversation["owner"] == "alice" and conversation["title"] == "Travel plans"
    messages = conversation["messages"]
    assert [m["content"] for m in messages] == [
        "Which animal has stripes, a zebra?",
        "Yes, the zebra has stripes.",
        "Perhaps a tiger.",
    ]
    assert [m["active"] for m in messages] == [True, True, False]
    assert [m["branch"] for m in messages] == [1, 1, 2]
    assert messages[1]["parent_id"] == messages[2]["parent_id"] == messages[0]["id"]
    last = messages[1]
    assert (last["role"], last["ttft_ms"], last["tokens_per_second"], last["finish_reason"]) == (
        "assistant",
        120,
        10.0,
        "stop",
    )


INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>")


def script_sources(policy: str) -> str:
    return next(part for part in policy.split(";") if part.strip().startswith("script-src"))


def test_admin_pages_carry_a_content_security_policy_that_forbids_inline_scripts(staff, chat):
    for client, url in [
        (Client(), "/admin/login/"),
        (staff, "/admin/"),
        (staff, CHANGELIST),
        (staff, transcript_url(chat)),
    ]:
        response = client.get(url)
        assert response.status_code == 200, url
        policy = response["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert script_sources(policy).split() == ["script-src", "'self'"]
        assert not INLINE_SCRIPT.search(response.content.decode()), url


def test_the_transcript_still_polls_while_a_reply_streams(staff, make_conversation, make_message):
    conversation = make_conversation()
    make_message(conversation, "Count", role="assistant", status="streaming")
    page = staff.get(transcript_url(conversation)).content.decode()
    script = re.search(r'<script src="([^"]*transcript[^"]*\.js)"', page)
    assert script, "the transcript's script is a static file"
    assert "pollUrl" in Client().get(script.group(1)).getvalue().decode()


def test_staff_filter_conversations_by_feedback_and_read_it_in_transcript_and_exports(
    staff, chat, make_conversation, make_message
):
    from chat.models import Feedback

    quiet = make_conversation(title="No feedback")
    make_message(quiet, "hi")
    rated = chat.messages.get(content="Yes, the zebra has stripes.")
    Feedback.objects.create(message=rated, rating="down", comment="Zebras are <i>striped</i>, fine")

    assert listed(staff.get(CHANGELIST, {"feedback": "down"})) == [chat]
    assert listed(staff.get(CHANGELIST, {"feedback": "up"})) == []
    assert listed(staff.get(CHANGELIST, {"feedback": "comment"})) == [chat]
    assert listed(staff.get(CHANGELIST, {"feedback": "none"})) == [quiet]
    page = staff.get(transcript_url(chat)).content.decode()
    assert "👎 down" in page and "Zebras are &lt;i&gt;striped&lt;/i&gt;, fine" in page
    markdown = export(staff, "export_markdown", [chat]).content.decode()
    assert "**Feedback:** 👎 down: Zebras are <i>striped</i>, fine" in markdown
    exported = json.loads(export(staff, "export_json", [chat]).content)["conversations"][0]
    assert exported["messages"][1]["feedback"]["rating"] == "down"


def test_a_superuser_creates_a_preset_and_replies_keep_what_they_were_asked_with(admin_client):
    from chat.models import Preset

    response = admin_client.post(
        reverse("admin:chat_preset_add"),
        {
            "name": "Reviewer",
            "description": "Reviews code",
            "system_prompt": "Review the code.",
            "temperature": "0.2",
            "top_p": "",
            "max_tokens": "300",
            "is_active": "on",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    preset = Preset.objects.get(name="Reviewer")
    assert (preset.temperature, preset.max_tokens, preset.is_active) == (0.2, 300, True)
    bad = admin_client.post(reverse("admin:chat_preset_add"), {"name": "Hot", "temperature": "7"})
    assert bad.status_code == 200 and not Preset.objects.filter(name="Hot").exists()


def test_the_transcript_shows_the_whole_tree_active_path_first(
    staff, make_conversation, make_message
):
    conversation = make_conversation(title="Branches")
    q1 = make_message(conversation, "first question")
    a1 = make_message(conversation, "first answer", role="assistant", reply_to=q1)
    q2 = make_message(conversation, "second question")
    make_message(conversation, "second answer", role="assistant", reply_to=q2)
    edited = make_message(conversation, "rewritten opener", parent=None)
    make_message(conversation, "answer to the edit", role="assistant", reply_to=edited)
    _space_out(list(conversation.messages.order_by("created_at")))
    page = staff.get(transcript_url(conversation)).content.decode()
    order = [
        "Active path",
        "rewritten opener",
        "answer to the edit",
        "Branch 2: another version of the question #1",
        "first question",
        "first answer",
        "second question",
        "second answer",
    ]
    positions = [page.index(part) for part in order]
    assert positions == sorted(positions)
    assert a1.pk and page.count("other branch</span>") == 4
