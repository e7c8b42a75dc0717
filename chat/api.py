"""The site JSON API (DESIGN.md): session auth + CSRF, JSON in and out. Views validate,
call a service or selector, and render."""

import functools
import logging
import uuid

from asgiref.sync import async_to_sync
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from chat import keys, selectors, services, shares, usage
from chat.inference_client import get_client
from chat.models import ApiKey, Conversation, Message, Preset
from chat.presenters import (
    api_key_json,
    conversation_detail_json,
    conversation_json,
    message_json,
    preset_json,
    share_json,
    usage_json,
)
from chat.validation import (
    InvalidInput,
    api_key_name,
    conversation_fields,
    feedback_fields,
    message_content,
    page_params,
    parse_json_object,
    share_fields,
    switch_target,
)

logger = logging.getLogger(__name__)


# The one place a service's refusal becomes an HTTP status.
SERVICE_ERROR_STATUS = {
    services.Conflict: 409,
    services.RateLimited: 429,
    services.Unavailable: 503,
}


def error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": {"message": message, "status": status}}, status=status)


def retry_after(exc: services.ServiceError) -> str | None:
    """Seconds until a quota resets, for clients that honour Retry-After."""
    resets_at = getattr(exc, "resets_at", None)
    if resets_at is None:
        return None
    return str(max(1, int((resets_at - timezone.now()).total_seconds())))


def service_error_status(exc: services.ServiceError) -> int:
    return next((code for kind, code in SERVICE_ERROR_STATUS.items() if isinstance(exc, kind)), 400)


def api_view(*methods: str):
    def decorate(view):
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return error(401, "Sign in first.")
            try:
                return view(request, *args, **kwargs)
            except InvalidInput as exc:
                return error(400, exc.message)
            except RequestDataTooBig:
                return error(413, "The request is too large.")
            except services.ServiceError as exc:
                response = error(service_error_status(exc), exc.message)
                if wait := retry_after(exc):
                    response["Retry-After"] = wait
                return response
            except (Conversation.DoesNotExist, Message.DoesNotExist, ApiKey.DoesNotExist):
                return error(404, "Not found.")

        return require_http_methods(list(methods))(wrapper)

    return decorate


def body_of(request) -> dict:
    return parse_json_object(request.body)


def message_out(message: Message) -> dict:
    return message_json(message, selectors.message_siblings(message=message))


def accepted(sent: services.SentMessage) -> JsonResponse:
    def out(message: Message) -> dict:
        if message.id in sent.siblings:
            return message_json(message, sent.siblings[message.id])
        return message_out(message)

    return JsonResponse(
        {"user_message": out(sent.user_message), "assistant_message": out(sent.assistant_message)},
        status=202,
    )


def detail_response(conversation: Conversation, **page) -> JsonResponse:
    """page: `limit` and `before` of the path's page (default: the whole path)."""
    detail = selectors.conversation_detail(conversation=conversation, **page)
    return JsonResponse(conversation_detail_json(detail))


def with_preset(fields: dict) -> dict:
    """The checked fields with `preset` looked up: an id must name an active preset."""
    if fields.get("preset") is not None:
        try:
            fields["preset"] = selectors.preset_get_active(preset_id=fields["preset"])
        except Preset.DoesNotExist:
            raise InvalidInput("`preset` is not one of the presets on offer.") from None
    return fields


@api_view("GET", "POST")
def conversations(request):
    if request.method == "POST":
        fields = with_preset(conversation_fields(body_of(request), partial=False))
        conversation = services.conversation_create(
            owner=request.user,
            title=fields.pop("title", ""),
            system_prompt=fields.pop("system_prompt", ""),
            preset=fields.pop("preset", None),
            settings_=fields,
        )
        return JsonResponse(conversation_json(conversation), status=201)
    query = request.GET.get("q", "")[:200]
    found = selectors.conversation_list(user=request.user, query=query)[:500]
    return JsonResponse({"conversations": [conversation_json(c) for c in found]})


@api_view("GET", "PATCH", "DELETE")
def conversation_detail(request, conversation_id: uuid.UUID):
    conversation = selectors.conversation_get(user=request.user, conversation_id=conversation_id)
    if request.method == "DELETE":
        services.conversation_delete(conversation=conversation)
        return HttpResponse(status=204)
    if request.method == "PATCH":
        fields = with_preset(conversation_fields(body_of(request), partial=True))
        conversation = services.conversation_update(conversation=conversation, fields=fields)
    before, limit = page_params(request.GET)
    return detail_response(conversation, limit=limit, before=before)


@api_view("POST")
def conversation_messages(request, conversation_id: uuid.UUID):
    content = message_content(body_of(request))
    # The service reads the conversation (and checks its owner) under its lock: one read.
    sent = services.message_send_to(
        owner_id=request.user.pk, conversation_id=conversation_id, content=content
    )
    return accepted(sent)


@api_view("POST")
def conversation_switch(request, conversation_id: uuid.UUID):
    message_id = switch_target(body_of(request))
    conversation = selectors.conversation_get(user=request.user, conversation_id=conversation_id)
    message = selectors.conversation_message(conversation=conversation, message_id=message_id)
    return detail_response(services.conversation_switch(conversation=conversation, message=message))


@api_view("POST", "DELETE")
def conversation_share(request, conversation_id: uuid.UUID):
    conversation = selectors.conversation_get(user=request.user, conversation_id=conversation_id)
    if request.method == "DELETE":
        shares.share_revoke(conversation=conversation)
        return HttpResponse(status=204)
    show_owner = share_fields(body_of(request))
    link, created = shares.share_create(conversation=conversation, show_owner=show_owner)
    return JsonResponse(share_json(link), status=201 if created else 200)


@api_view("GET")
def message_detail(request, message_id: uuid.UUID):
    return JsonResponse(
        message_out(selectors.message_get(user=request.user, message_id=message_id))
    )


@api_view("POST")
def message_stop(request, message_id: uuid.UUID):
    message = selectors.message_get(user=request.user, message_id=message_id)
    services.reply_stop(reply=message)
    return JsonResponse({"message": message_json(message)}, status=202)


@api_view("POST")
def message_regenerate(request, message_id: uuid.UUID):
    message = selectors.message_get(user=request.user, message_id=message_id)
    reply = services.reply_regenerate(reply=message)
    return JsonResponse({"assistant_message": message_out(reply)}, status=202)


@api_view("POST")
def message_edit(request, message_id: uuid.UUID):
    content = message_content(body_of(request))
    message = selectors.message_get(user=request.user, message_id=message_id)
    return accepted(services.message_edit(message=message, content=content))


@api_view("PUT")
def message_feedback(request, message_id: uuid.UUID):
    rating, comment = feedback_fields(body_of(request))
    message = selectors.message_get(user=request.user, message_id=message_id)
    services.feedback_set(reply=message, rating=rating, comment=comment)
    return JsonResponse(
        message_out(selectors.message_get(user=request.user, message_id=message_id))
    )


@api_view("GET")
def presets(request):
    return JsonResponse({"presets": [preset_json(p) for p in selectors.presets_active()]})


@api_view("GET")
def models(request):
    return JsonResponse({"models": async_to_sync(get_client().list_models)()})


@api_view("GET")
def usage_view(request):
    figures = usage.user_usage(user=request.user)
    quotas = usage.user_quotas(user=request.user, usage=figures)
    return JsonResponse(usage_json(figures, quotas))


@api_view("GET", "POST")
def api_keys(request):
    if request.method == "POST":
        name = api_key_name(body_of(request))
        key, secret = keys.api_key_create(user=request.user, name=name)
        return JsonResponse(api_key_json(key, secret), status=201)
    return JsonResponse(
        {"keys": [api_key_json(key) for key in keys.api_keys_of(user=request.user)]}
    )


@api_view("DELETE")
def api_key_detail(request, key_id: uuid.UUID):
    keys.api_key_revoke(key=keys.api_key_get(user=request.user, key_id=key_id))
    return HttpResponse(status=204)
