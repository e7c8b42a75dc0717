"""Pages, the event stream gate and the site's /metrics."""

import uuid

from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils.crypto import constant_time_compare
from django.views.decorators.http import require_http_methods
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chat import selectors, throttle
from chat.client_address import client_address, client_key
from chat.models import Conversation, ShareLink
from chat.presenters import conversation_detail_json, message_json
from chat.relay.metrics import REGISTRY

SIGNUP_WINDOW = 3600


@login_required
def home(request):
    return render(request, "chat/chat.html", {"initial": None})


@login_required
def conversation_page(request, conversation_id: uuid.UUID):
    try:
        conversation = selectors.conversation_get(
            user=request.user, conversation_id=conversation_id
        )
    except Conversation.DoesNotExist:
        raise Http404("No such conversation.") from None
    detail = selectors.conversation_detail(
        conversation=conversation, limit=settings.CHAT_MESSAGES_PAGE_SIZE
    )
    initial = conversation_detail_json(detail)
    return render(request, "chat/chat.html", {"initial": initial, "conversation": conversation})


SHARED_FIELDS = ("id", "role", "content", "status", "model", "created_at")


@require_http_methods(["GET", "HEAD"])
def share_page(request, token: str):
    """A shared snapshot, read-only. It shows the shared messages and, if the owner agreed,
    their username: nothing else of the owner (no ids of theirs, no other conversation)."""
    if not settings.SHARE_PUBLIC and not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    try:
        link = selectors.share_link_by_token(token=token)
    except ShareLink.DoesNotExist:
        raise Http404("No such shared conversation.") from None
    messages = [
        {k: v for k, v in message_json(m).items() if k in SHARED_FIELDS}
        for m in selectors.share_link_messages(link=link)
    ]
    context = {
        "title": link.conversation.title or "Shared conversation",
        "owner": link.conversation.owner.get_username() if link.show_owner else "",
        "shared_at": link.updated_at,
        "shared": {"messages": messages},
    }
    response = render(request, "chat/share.html", context)
    # A revoked link must stop working at once, and the token must not leak onwards.
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


@require_http_methods(["GET", "POST"])
def signup(request):
    if not settings.SIGNUP_ENABLED:
        raise Http404("Sign-up is turned off on this site.")
    if request.user.is_authenticated:
        return redirect("chat:home")
    if request.method == "GET":
        return render(request, "registration/signup.html", {"form": UserCreationForm()})
    # Counted before the form is checked, so simultaneous sign-ups cannot all pass.
    key = f"signup:{throttle.digest(client_key(client_address(request)))}"
    if throttle.hit(key, SIGNUP_WINDOW) > settings.SIGNUPS_PER_HOUR:
        throttle.unhit(key)
        refusal = "Too many accounts were created from your network. Try again in an hour."
        context = {"form": UserCreationForm(), "refusal": refusal}
        return render(request, "registration/signup.html", context, status=429)
    form = UserCreationForm(request.POST)
    if not form.is_valid():
        throttle.unhit(key)
        return render(request, "registration/signup.html", {"form": form})
    user = form.save()
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect("chat:home")


def metrics(request):
    """Not public: staff signed in, or a bearer token from METRICS_TOKEN for scrapers."""
    token = settings.METRICS_TOKEN
    bearer = request.headers.get("Authorization", "")
    # Constant time: `==` stops at the first wrong character, and the time that takes
    # tells a guesser how much of the token is right.
    allowed = (request.user.is_authenticated and request.user.is_staff) or bool(
        token and constant_time_compare(bearer, f"Bearer {token}")
    )
    if not allowed:
        return HttpResponse("Forbidden.\n", status=403, content_type="text/plain")
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
