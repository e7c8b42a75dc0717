"""Staff review of transcripts. Nothing here can change what a user or the model said:
conversations can at most be deleted, messages not even that."""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from chat import exports, sampling, selectors
from chat.models import Conversation, Message, Preset
from chat.permissions import can_review

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
        return [(name, name) for name in selectors.reply_model_names()]

    def queryset(self, request, queryset):
        if self.value():
            return selectors.conversations_with_reply_model(queryset, model=self.value())
        return queryset


class FeedbackFilter(admin.SimpleListFilter):
    """Conversations by what users said of their replies."""

    title = "feedback"
    parameter_name = "feedback"

    def lookups(self, request, model_admin):
        return [
            ("up", "👍 a reply rated up"),
            ("down", "👎 a reply rated down"),
            ("comment", "a comment"),
            ("none", "no feedback"),
        ]

    def queryset(self, request, queryset):
        if self.value() in {"up", "down", "comment", "none"}:
            return selectors.conversations_with_feedback(queryset, kind=self.value())
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
        "source",
        "transcript_link",
    )
    list_filter = (
        StatusFilter,
        FeedbackFilter,
        "source",
        ModelFilter,
        ("updated_at", admin.DateFieldListFilter),
        ("owner", admin.RelatedOnlyFieldListFilter),
    )
    search_fields = ("owner__username", "title", "messages__content")
    list_select_related = ("owner", "preset")
    fields = (
        "id",
        "owner",
        "title",
        "preset",
        "model",
        "system_prompt",
        "temperature",
        "top_p",
        "max_tokens",
        *sampling.NAMES,
        "source",
        "created_at",
        "updated_at",
    )
    actions = ("export_markdown", "export_json")

    def get_queryset(self, request):
        return selectors.conversations_with_summary(super().get_queryset(request))

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path(
                "<uuid:object_id>/transcript/",
                view(self.transcript_view),
                name="chat_conversation_transcript",
            ),
            path(
                "<uuid:object_id>/transcript.json",
                view(self.transcript_json_view),
                name="chat_conversation_transcript_json",
            ),
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
            "sections": exports.transcript_sections(
                selectors.conversation_transcript(conversation=conversation)
            ),
            "poll_url": reverse("admin:chat_conversation_transcript_json", args=[conversation.pk]),
            "streaming": conversation.reply_status == Message.Status.STREAMING,
            "has_delete_permission": self.has_delete_permission(request, conversation),
        }
        return TemplateResponse(request, "admin/chat/conversation/transcript.html", context)

    def transcript_json_view(self, request, object_id):
        """What the transcript page polls while a reply streams."""
        conversation = self.reviewed(request, object_id)
        data = exports.export_conversation_json(conversation)
        data["streaming"] = conversation.reply_status == Message.Status.STREAMING
        return JsonResponse(data)

    @admin.action(description="Export selected conversations as Markdown", permissions=["view"])
    def export_markdown(self, request, queryset):
        return exports.markdown_download(queryset.order_by("created_at"))

    @admin.action(description="Export selected conversations as JSON", permissions=["view"])
    def export_json(self, request, queryset):
        return exports.json_download(queryset.order_by("created_at"))


@admin.register(Message)
class MessageAdmin(ReviewOnly, admin.ModelAdmin):
    list_display = ("short_content", "role", "status", "conversation", "model", "created_at")
    list_filter = ("role", "status", "model", "created_at")
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


@admin.register(Preset)
class PresetAdmin(admin.ModelAdmin):
    """Staff with the preset permissions prepare assistants here. Replies keep a copy of
    what they were asked with, so editing a preset never rewrites the past."""

    list_display = (
        "name",
        "description",
        "is_active",
        "temperature",
        "top_p",
        "max_tokens",
        "updated_at",
    )
    list_filter = ("is_active",)
    search_fields = ("name", "description", "system_prompt")
    fields = (
        "name",
        "description",
        "system_prompt",
        "temperature",
        "top_p",
        "max_tokens",
        *sampling.NAMES,
        "is_active",
    )


# Usage, quotas and API keys register their own admins.
from chat import admin_usage  # noqa: E402,F401
