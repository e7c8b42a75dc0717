"""Whether an open event stream may go on: checked when it opens and again every
keep-alive, so signing out (or being deactivated, or a password change, which ends the
other sessions) also ends the streams the session opened."""

from importlib import import_module
from types import SimpleNamespace

from django.conf import settings
from django.contrib import auth

from chat import current_user
from chat.selectors import conversation_readable_by


def _current_user(scope):
    session = scope.get("session")
    if session is None or not session.session_key:
        # No session to go back to (an in-process caller): re-read the user instead.
        user = scope.get("user")
        model = auth.get_user_model()
        return model.objects.filter(pk=getattr(user, "pk", None), is_active=True).first()
    # A fresh store, not the scope's copy: that one was loaded when the stream opened.
    fresh = import_module(settings.SESSION_ENGINE).SessionStore(session.session_key)
    user = current_user.get_user(SimpleNamespace(session=fresh))  # Django's, one plain SELECT
    return user if user.is_authenticated else None


def stream_may_continue(scope, conversation_id) -> bool:
    """Sync (database reads): the same user, still signed in, may still read it."""
    opened_by = scope.get("user")
    user = _current_user(scope)
    if user is None or opened_by is None or user.pk != opened_by.pk:
        return False
    return conversation_readable_by(user=user, conversation_id=conversation_id)
