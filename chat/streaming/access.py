"""Whether an open event stream may go on: checked when it opens and again every
keep-alive, so signing out (or being deactivated, or a password change, which ends the
other sessions) also ends the streams the session opened."""

from importlib import import_module
from types import SimpleNamespace

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import auth
from django.db import DatabaseError, connection

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


def _keeping_connection(function):
    """`function` made async on the thread where the relay's reads and writes run
    (asgiref's thread for sync code outside a request), whose database connection stays
    open from one call to the next. channels' database_sync_to_async closes it after every
    call (CONN_MAX_AGE is 0): opening the SQLite file again cost ~0.7 ms of CPU per check,
    the check itself ~0.3 ms and the hop to the thread ~0.6 ms, for every open stream at
    every keep-alive. A connection that failed is closed; the next call opens a new one."""

    def run(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except DatabaseError:
            connection.close()
            raise

    return sync_to_async(run)


astream_may_continue = _keeping_connection(stream_may_continue)
aconversation_readable_by = _keeping_connection(conversation_readable_by)
