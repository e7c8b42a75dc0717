"""Staff review of transcripts. Nothing here can change what a user or the model said:
conversations can at most be deleted, messages not even that."""

import json

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    Max,
    OuterRef,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.http import Http404, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from chat.models import Conversation, Message
from chat.presenters import conversation_json, message_json

# The one permission that opens other users' transcripts, here and on the event stream
# (chat.selectors.conversation_readable_by): a change permission alone must not.
VIEW_PERMISSION = "chat.view_conversation"


def can_review(user) -> bool:
    return user.is_active and user.is_staff and user.has_perm(VIEW_PERMISSION)


def transcript_messages(conversation: Conversation) -> QuerySet[Message]:
    """Every message, replaced ones included: a review must see what was regenerated."""
    return conversation.messages.order_by("created_at", "id")


def with_summary(conversations: QuerySet[Conversation]) -> QuerySet[Conversation]:
    replies = Message.objects.filter(
        conversation=OuterRef("pk"), role=Message.Role.ASSISTANT, superseded=False
    ).order_by("-created_at")
    streaming = Message.objects.filter(
        conversation=OuterRef("pk"), status=Message.Status.STREAMING
    )
    return conversations.annotate(
        message_count=Count("messages", distinct=True),
        # Replies are flushed without touching the conversation row, so its updated_at
        # alone would hide a long reply still being written.
        last_activity=Coalesce(Max("messages__updated_at"), "updated_at"),
        last_reply_model=Subquery(replies.values("model")[:1]),
        reply_status=Case(
            When(Exists(streaming), then=Value(Message.Status.STREAMING)),
            default=Subquery(replies.values("status")[:1]),
            output_field=CharField(),
        ),
    )


# --- exports -------------------------------------------------------------------------


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
    data["messages"] = [export_message_json(m) for m in transcript_messages(conversation)]
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
    parts = ["\n".join(header), *(message_markdown(m) for m in transcript_messages(conversation))]
    return "\n\n".join(parts) + "\n"


def download(body: str, *, name: str, content_type: str) -> HttpResponse:
    response = HttpResponse(body, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def export_name(extension: str) -> str:
    return f"conversations-{timezone.now():%Y%m%d-%H%M%S}.{extension}"


# --- list filters --------------------------------------------------------------------


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return Message.Status.choices

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(reply_status=self.value())
        return queryset


class ModelFilter(admin.SimpleListFilter):
    """By the model that wrote a reply: a conversation's own field is usually blank."""

    title = "model"
    parameter_name = "model"

    def lookups(self, request, model_admin):
        models = (
            Message.objects.filter(role=Message.Role.ASSISTANT)
            .exclude(model="")
            .values_list("model", flat=True)
            .distinct()
            .order_by("model")
        )
        return [(name, name) for name in models]

    def queryset(self, request, queryset):
        if self.value():
            replies = Message.objects.filter(conversation=OuterRef("pk"), model=self.value())
            return queryset.filter(Exists(replies))
        return queryset


# --- admins --------------------------------------------------------------------------


class ReviewOnly:
    """Reading needs chat.view_conversation; nobody adds or edits through the admin."""

    def has_view_permission(self, request, obj=None):
        return can_review(request.user)

    def has_module_permission(self, request):
        return can_review(request.user)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Conversation)
class ConversationAdmin(ReviewOnly, admin.ModelAdmin):
    list_display = (
        "title_or_id",
        "owner",
        "message_count",
        "last_activity",
        "model_used",
        "status",
        "transcript_link",
    )
    list_filter = (
        StatusFilter,
        ModelFilter,
        ("updated_at", admin.DateFieldListFilter),
        ("owner", admin.RelatedOnlyFieldListFilter),
    )
    search_fields = ("owner__username", "title", "messages__content")
    list_select_related = ("owner",)
    fields = (
        "id",
        "owner",
        "title",
        "model",
        "system_prompt",
        "temperature",
        "top_p",
        "max_tokens",
        "created_at",
        "updated_at",
    )
    actions = ("export_markdown", "export_json")

    def get_queryset(self, request):
        return with_summary(super().get_queryset(request))

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<uuid:object_id>/transcript/", view(self.transcript_view),
                 name="chat_conversation_transcript"),
            path("<uuid:object_id>/transcript.json", view(self.transcript_json_view),
                 name="chat_conversation_transcript_json"),
            *super().get_urls(),
        ]

    @admin.display(description="title", ordering="title")
    def title_or_id(self, conversation):
        return str(conversation)

    @admin.display(description="messages", ordering="message_count")
    def message_count(self, conversation):
        return conversation.message_count

    @admin.display(description="last activity", ordering="last_activity")
    def last_activity(self, conversation):
        return conversation.last_activity

    @admin.display(description="model")
    def model_used(self, conversation):
        return conversation.model or conversation.last_reply_model or "(server default)"

    @admin.display(description="status", ordering="reply_status")
    def status(self, conversation):
        return conversation.reply_status or "-"

    @admin.display(description="transcript")
    def transcript_link(self, conversation):
        url = reverse("admin:chat_conversation_transcript", args=[conversation.pk])
        return format_html('<a href="{}">Read</a>', url)

    def reviewed(self, request, object_id) -> Conversation:
        if not self.has_view_permission(request):
            raise PermissionDenied
        conversation = self.get_object(request, str(object_id))
        if conversation is None:
            raise Http404("No such conversation.")
        return conversation

    def transcript_view(self, request, object_id):
        conversation = self.reviewed(request, object_id)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Transcript: {conversation}",
            "conversation": conversation,
            "transcript": transcript_messages(conversation),
            "poll_url": reverse(
                "admin:chat_conversation_transcript_json", args=[conversation.pk]
            ),
            "streaming": conversation.reply_status == Message.Status.STREAMING,
            "has_delete_permission": self.has_delete_permission(request, conversation),
        }
        return TemplateResponse(request, "admin/chat/conversation/transcript.html", context)

    def transcript_json_view(self, request, object_id):
        """What the transcript page polls while a reply streams."""
        conversation = self.reviewed(request, object_id)
        data = export_conversation_json(conversation)
        data["streaming"] = conversation.reply_status == Message.Status.STREAMING
        return JsonResponse(data)

    @admin.action(description="Export selected conversations as Markdown", permissions=["view"])
    def export_markdown(self, request, queryset):
        body = "\n---\n\n".join(conversation_markdown(c) for c in queryset.order_by("created_at"))
        return download(body, name=export_name("md"), content_type="text/markdown")

    @admin.action(description="Export selected conversations as JSON", permissions=["view"])
    def export_json(self, request, queryset):
        conversations = queryset.order_by("created_at")
        data = {"conversations": [export_conversation_json(c) for c in conversations]}
        body = json.dumps(data, ensure_ascii=False, indent=2)
        return download(body, name=export_name("json"), content_type="application/json")


@admin.register(Message)
class MessageAdmin(ReviewOnly, admin.ModelAdmin):
    list_display = ("short_content", "role", "status", "conversation", "model", "created_at")
    list_filter = ("role", "status", "superseded", "model", "created_at")
    search_fields = ("content", "conversation__title", "conversation__owner__username")
    list_select_related = ("conversation",)

    # A message goes only with its whole conversation: deleting one alone would silently
    # rewrite a transcript. The admin asks this permission of every message a conversation
    # delete cascades to, so it follows the conversation's; the message's own delete view
    # and bulk action are removed instead.
    def has_delete_permission(self, request, obj=None):
        return request.user.has_perm("chat.delete_conversation")

    def delete_view(self, request, object_id, extra_context=None):
        raise PermissionDenied

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "show_delete": False}
        return super().change_view(request, object_id, form_url, extra_context)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="content")
    def short_content(self, message):
        text = " ".join(message.content.split())
        return text[:80] + ("…" if len(text) > 80 else "")
