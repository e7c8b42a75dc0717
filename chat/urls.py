from django.urls import path, re_path

from chat import api, openai_api, views

app_name = "chat"

urlpatterns = [
    path("", views.home, name="home"),
    path("c/<uuid:conversation_id>/", views.conversation_page, name="conversation"),
    path("api/conversations/", api.conversations, name="api-conversations"),
    path(
        "api/conversations/<uuid:conversation_id>/",
        api.conversation_detail,
        name="api-conversation",
    ),
    path(
        "api/conversations/<uuid:conversation_id>/messages/",
        api.conversation_messages,
        name="api-conversation-messages",
    ),
    path(
        "api/conversations/<uuid:conversation_id>/switch/",
        api.conversation_switch,
        name="api-conversation-switch",
    ),
    path(
        "api/conversations/<uuid:conversation_id>/share/",
        api.conversation_share,
        name="api-conversation-share",
    ),
    path("api/messages/<uuid:message_id>/", api.message_detail, name="api-message"),
    path("api/messages/<uuid:message_id>/stop/", api.message_stop, name="api-message-stop"),
    path(
        "api/messages/<uuid:message_id>/regenerate/",
        api.message_regenerate,
        name="api-message-regenerate",
    ),
    path("api/messages/<uuid:message_id>/edit/", api.message_edit, name="api-message-edit"),
    path(
        "api/messages/<uuid:message_id>/feedback/",
        api.message_feedback,
        name="api-message-feedback",
    ),
    path("api/presets/", api.presets, name="api-presets"),
    path("api/models/", api.models, name="api-models"),
    path("s/<str:token>/", views.share_page, name="share"),
    path("api/usage/", api.usage_view, name="api-usage"),
    path("api/keys/", api.api_keys, name="api-keys"),
    path("api/keys/<uuid:key_id>/", api.api_key_detail, name="api-key"),
    path("metrics", views.metrics, name="metrics"),
    # The OpenAI-compatible API, for API keys only (chat/openai_api.py).
    path("v1/chat/completions", openai_api.chat_completions, name="v1-chat-completions"),
    path("v1/models", openai_api.models, name="v1-models"),
    path("v1/models/<path:model_id>", openai_api.model_detail, name="v1-model"),
    re_path(r"^v1/(?P<rest>.*)$", openai_api.not_found),
]
