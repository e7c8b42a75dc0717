"""Transcripts as files: Markdown for people, JSON for tools. Every branch is included, the
active path first, so an export shows what was regenerated or edited, and every reply's
feedback and the preset and settings it was asked with."""

import json
from dataclasses import dataclass

from django.http import HttpResponse
from django.utils import timezone

from chat import selectors
from chat.models import Conversation, Message
from chat.presenters import conversation_json, feedback_json, message_json


@dataclass(frozen=True)
class Section:
    """One branch of a transcript, ready to print: its title and its numbered messages."""

    number: int
    title: str
    active: bool
    messages: list  # (number, Message)


def transcript_sections(transcript: selectors.Transcript) -> list[Section]:
    sections = []
    for branch in transcript.branches:
        if branch.fork_of is None and branch.number == 1:
            title = "Active path"
        elif branch.fork_of is not None:
            kind = "question" if transcript.messages[branch.fork_of].role == "user" else "reply"
            title = f"Branch {branch.number}: another version of the {kind} #{transcript.numbers[branch.fork_of]}"
        else:
            parent = transcript.messages[branch.messages[0]].parent_id
            title = f"Branch {branch.number}: goes on after #{transcript.numbers.get(parent, '?')}"
        messages = [(transcript.numbers[i], transcript.messages[i]) for i in branch.messages]
        sections.append(Section(branch.number, title, branch.number == 1, messages))
    return sections


def export_message_json(message: Message, *, number: int, branch: int, active: bool) -> dict:
    data = message_json(message)
    data.pop("siblings")
    data.pop("preset_name", None)
    return {
        **data,
        "number": number,
        "branch": branch,
        "active": active,
        "feedback": feedback_json(getattr(message, "feedback", None)),
        "generation": message.generation or None,
        "updated_at": message.updated_at.isoformat(),
    }


def export_conversation_json(conversation: Conversation) -> dict:
    data = conversation_json(conversation)
    data.pop("events_url")
    data["owner"] = conversation.owner.get_username()
    data["active_leaf_id"] = (
        str(conversation.active_leaf_id) if conversation.active_leaf_id else None
    )
    transcript = selectors.conversation_transcript(conversation=conversation)
    data["messages"] = [
        export_message_json(m, number=n, branch=section.number, active=section.active)
        for section in transcript_sections(transcript)
        for n, m in section.messages
    ]
    return data


def message_figures(message: Message) -> list[str]:
    figures = [message.created_at.isoformat(timespec="seconds"), message.status]
    if message.model:
        figures.append(f"model {message.model}")
    preset = (message.generation or {}).get("preset")
    if preset:
        figures.append(f"preset {preset['name']}")
    if message.ttft_ms is not None:
        figures.append(f"TTFT {message.ttft_ms} ms")
    if message.tokens_per_second is not None:
        figures.append(f"{message.tokens_per_second} tokens/s")
    if message.completion_tokens is not None:
        figures.append(f"{message.completion_tokens} tokens")
    if message.finish_reason:
        figures.append(f"finish {message.finish_reason}")
    return figures


def feedback_line(message: Message) -> str | None:
    feedback = getattr(message, "feedback", None)
    if feedback is None:
        return None
    rating = {"up": "👍 up", "down": "👎 down"}.get(feedback.rating, "no rating")
    return f"> **Feedback:** {rating}" + (f": {feedback.comment}" if feedback.comment else "")


def message_markdown(number: int, message: Message) -> str:
    lines = [f"### #{number} {message.role}", "", f"_{' · '.join(message_figures(message))}_", ""]
    lines.append(message.content or "_(no text)_")
    if message.error:
        lines += ["", f"> **Error:** {message.error}"]
    if feedback := feedback_line(message):
        lines += ["", feedback]
    return "\n".join(lines)


def conversation_markdown(conversation: Conversation) -> str:
    header = [
        f"# {conversation}",
        "",
        f"- id: `{conversation.id}`",
        f"- owner: {conversation.owner.get_username()}",
        f"- model: {conversation.model or '(server default)'}",
        f"- preset: {conversation.preset.name if conversation.preset else '(none)'}",
        f"- created: {conversation.created_at.isoformat(timespec='seconds')}",
    ]
    if conversation.system_prompt:
        header += ["", "## System prompt", "", conversation.system_prompt]
    parts = ["\n".join(header)]
    transcript = selectors.conversation_transcript(conversation=conversation)
    for section in transcript_sections(transcript):
        parts.append(f"## {section.title}")
        parts += [message_markdown(n, m) for n, m in section.messages]
    return "\n\n".join(parts) + "\n"


def download(body: str, *, name: str, content_type: str) -> HttpResponse:
    response = HttpResponse(body, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def export_name(extension: str) -> str:
    return f"conversations-{timezone.now():%Y%m%d-%H%M%S}.{extension}"


def markdown_download(conversations) -> HttpResponse:
    body = "\n---\n\n".join(conversation_markdown(c) for c in conversations)
    return download(body, name=export_name("md"), content_type="text/markdown")


def json_download(conversations) -> HttpResponse:
    data = {"conversations": [export_conversation_json(c) for c in conversations]}
    body = json.dumps(data, ensure_ascii=False, indent=2)
    return download(body, name=export_name("json"), content_type="application/json")
