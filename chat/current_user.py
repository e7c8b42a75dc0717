"""request.user as Django's AuthenticationMiddleware gives it, the user's row read by one
plain SELECT.

Every request reads its user (every send, every page, every event stream). Django's get_user
asks the session's backend, and ModelBackend builds User.objects.get(pk=...) through the ORM
at a cost several times that of running the query: about a tenth of a send's CPU (py-spy).
For a session signed in through ModelBackend, which is how this site signs users in, the
same row is read as one plain SELECT and built as the ORM builds it (Model.from_db), then
checked as Django checks it: the backend is still configured, the user may sign in
(is_active), and the session's auth hash matches the password's, or a fallback secret's (the
session's key is then cycled), else the session is flushed. A session of any other backend
goes through Django's own get_user.
"""

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.auth.models import AnonymousUser
from django.utils.crypto import constant_time_compare
from django.utils.functional import SimpleLazyObject

from chat import selectors

MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


class CurrentUserMiddleware(AuthenticationMiddleware):
    """Django's AuthenticationMiddleware with request.user from get_user below."""

    def process_request(self, request):
        super().process_request(request)
        request.user = SimpleLazyObject(lambda: get_user(request))


def get_user(request):
    """django.contrib.auth.get_user, the same user, session checks and session changes."""
    session = request.session
    if session.get(auth.BACKEND_SESSION_KEY) != MODEL_BACKEND:
        return auth.get_user(request)  # signed out, or another backend: Django's own
    if MODEL_BACKEND not in settings.AUTHENTICATION_BACKENDS:
        return AnonymousUser()
    try:
        user_id = auth._get_user_session_key(request)
    except KeyError:
        return AnonymousUser()
    user = selectors.user_by_id(user_id=user_id)
    if user is None or not ModelBackend().user_can_authenticate(user):
        return AnonymousUser()
    return user if _session_verified(session, user) else AnonymousUser()


def _session_verified(session, user) -> bool:
    """Django's check of the session's auth hash, with its fallback secrets."""
    session_hash = session.get(auth.HASH_SESSION_KEY)
    user_hash = user.get_session_auth_hash()
    if session_hash and constant_time_compare(session_hash, user_hash):
        return True
    if session_hash and any(
        constant_time_compare(session_hash, fallback)
        for fallback in user.get_session_auth_fallback_hash()
    ):
        session.cycle_key()
        session[auth.HASH_SESSION_KEY] = user_hash
        return True
    session.flush()
    return False
