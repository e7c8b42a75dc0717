"""request.user (chat/current_user.py): what Django's get_user gives, session by session."""

import pytest
from django.contrib import auth
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

from chat import current_user
from chat.sessions import SessionStore

pytestmark = pytest.mark.django_db


def _signed_in(user) -> str:
    """A session key of `user` signed in as the sign-in page signs in (ModelBackend)."""
    request = RequestFactory().get("/")
    request.session = SessionStore()
    auth.login(request, user, backend=current_user.MODEL_BACKEND)
    request.session.save()
    return request.session.session_key


def _read(get_user, session_key):
    """The user `get_user` gives a request of that session, and what it left of the session."""
    request = RequestFactory().get("/")
    request.session = SessionStore(session_key)
    user = get_user(request)
    return user, request.session.session_key, dict(request.session.items())


def _as_fields(user) -> tuple:
    if user.is_anonymous:
        return (type(user),)
    return (type(user), *(getattr(user, f.attname) for f in type(user)._meta.concrete_fields))


def _assert_same(ours, django):
    assert _as_fields(ours[0]) == _as_fields(django[0])
    assert (ours[1] is None) == (django[1] is None)  # flushed by both, or by neither
    assert ours[2].keys() == django[2].keys()


def test_a_signed_in_user_is_the_row_django_reads_field_by_field(make_user):
    user = make_user("alice", staff=True)
    key = _signed_in(user)
    ours, django = _read(current_user.get_user, key), _read(auth.get_user, key)
    _assert_same(ours, django)
    assert ours[0].pk == user.pk and ours[0].is_staff and ours[0]._state.adding is False
    assert ours[1] == key  # the session stays as it was


@pytest.mark.parametrize(
    "change",
    ["deactivated", "password changed", "deleted", "backend no longer configured"],
)
def test_a_session_django_refuses_is_refused_alike(make_user, settings, change):
    user = make_user()
    keys = [_signed_in(user), _signed_in(user)]  # one for each reader
    if change == "deactivated":
        user.is_active = False
        user.save()
    elif change == "password changed":
        user.set_password("something else entirely")
        user.save()
    elif change == "deleted":
        user.delete()
    else:
        settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.RemoteUserBackend"]
    ours, django = _read(current_user.get_user, keys[0]), _read(auth.get_user, keys[1])
    assert isinstance(ours[0], AnonymousUser)
    _assert_same(ours, django)
    assert (ours[1] is None) == (change == "password changed")  # flushed, as Django does


def test_a_session_of_a_rotated_secret_keeps_its_user_with_a_new_key(make_user, settings):
    user = make_user()
    old_secret = settings.SECRET_KEY
    keys = [_signed_in(user), _signed_in(user)]
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a new secret " * 4, [old_secret]
    ours = _read(current_user.get_user, keys[0])
    django = _read(auth.get_user, keys[1])
    _assert_same(ours, django)
    assert ours[0].pk == user.pk and ours[1] not in (None, keys[0])  # cycled, as Django does
    assert ours[2][auth.HASH_SESSION_KEY] == user.get_session_auth_hash()


def test_no_session_or_another_backend_goes_through_django(make_user, settings):
    assert isinstance(_read(current_user.get_user, None)[0], AnonymousUser)
    user = make_user()
    settings.AUTHENTICATION_BACKENDS = [
        current_user.MODEL_BACKEND,
        "django.contrib.auth.backends.AllowAllUsersModelBackend",
    ]
    request = RequestFactory().get("/")
    request.session = SessionStore()
    auth.login(request, user, backend="django.contrib.auth.backends.AllowAllUsersModelBackend")
    request.session.save()
    user.is_active = False  # that backend lets inactive users in; ModelBackend would not
    user.save()
    assert _read(current_user.get_user, request.session.session_key)[0].pk == user.pk


def test_the_site_reads_request_user_through_it(client, make_user, monkeypatch):
    reads = []
    by_id = current_user.selectors.user_by_id
    monkeypatch.setattr(
        current_user.selectors, "user_by_id", lambda **kw: reads.append(kw) or by_id(**kw)
    )
    user = make_user()
    client.force_login(user)
    assert client.get("/api/conversations/").status_code == 200
    assert reads == [{"user_id": user.pk}]
