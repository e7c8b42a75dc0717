"""Transcripts as files: Markdown for people, JSON for tools. Every message is included,
replaced ones too, so an export shows what was regenerated or edited."""

import json

from django.http import HttpResponse
from django.utils import timezone

from chat import selectors
from chat.models import Conversation, Message
from chat.presenters import conversation_json, message_json


def export_message_json(message: Message) -> dict:
    return {
        **message_json(message),
        "superseded": message.superseded,
        "updated_at": message.updated_at.isoformat(),
    }


def export_conversation_json(conversation: Conversation) -> dict:
    data = conversation_json(conversation)
    data.pop("events_url")
    data["owner"] = conversation.owner.get_username()
    data["messages"] = [export_message_json(m) for m in selectors.conversation_transcript(conversation=conversation)]
    return data


def message_figures(message: Message) -> list[str]:
    figures = [message.created_at.isoformat(timespec="seconds"), message.status]
    if message.model:
        figures.append(f"model {message.model}")
    if message.ttft_ms is not None:
        figures.append(f"TTFT {message.ttft_ms} ms")
    if message.tokens_per_second is not None:
        figures.append(f"{message.tokens_per_second} tokens/s")
    if message.completion_tokens is not None:
        figures.append(f"{message.completion_tokens} tokens")
    if message.finish_reason:
        figures.append(f"finish {message.finish_reason}")
    if message.superseded:
        figures.append("replaced")
    return figures


def message_markdown(message: Message) -> str:
    lines = [f"### {message.role}", "", f"_{' · '.join(message_figures(message))}_", ""]
    lines.append(message.content or "_(no text)_")
    if message.error:
        lines += ["", f"> **Error:** {message.error}"]
    return "\n".join(lines)


def conversation_markdown(conversation: Conversation) -> str:
    header = [
        f"# {conversation}",
        "",
        f"- id: `{conversation.id}`",
        f"- owner: {conversation.owner.get_username()}",
        f"- model: {conversation.model or '(server default)'}",
        f"- created: {conversation.created_at.isoformat(timespec='seconds')}",
    ]
    if conversation.system_prompt:
        header += ["", "## System prompt", "", conversation.system_prompt]
    parts = ["\n".join(header), *(message_markdown(m) for m in selectors.conversation_transcript(conversation=conversation))]
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
