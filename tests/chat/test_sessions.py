"""The session engine (chat/sessions.py): cached_db through one cache client per process."""

import contextvars

import pytest

from chat.sessions import SessionStore

pytestmark = pytest.mark.django_db


def test_sessions_of_different_requests_share_one_cache_client():
    # Each ASGI request runs in a context of its own, where Django's `caches` gives a new
    # cache instance (with Redis: a new connection pool and connection every request).
    stores = [contextvars.Context().run(SessionStore) for _ in range(3)]
    assert len({id(store._cache) for store in stores}) == 1


def test_a_session_saved_is_read_back_and_a_deleted_one_is_gone():
    store = SessionStore()
    store["user"] = 7
    store.save()
    key = store.session_key
    assert contextvars.Context().run(SessionStore, key)["user"] == 7
    SessionStore(key).delete()
    assert not contextvars.Context().run(SessionStore, key).exists(key)
