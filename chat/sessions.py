"""The site's session engine: Django's cached_db sessions (settings.SESSION_ENGINE) read
through one cache client per process.

Django keeps its cache instances in asgiref's Local, which under ASGI is per request
context: every request got a cache instance of its own, and with Redis its own connection
pool and a new connection, handshake included (most of a session read's cost, and of a
send's with Redis). Sessions are read on every request and by every event stream; one
instance serves them all (redis-py's pool and the local-memory cache are both safe across
threads).
"""

import threading

from django.conf import settings
from django.contrib.sessions.backends import cached_db
from django.core.cache import caches
from django.core.signals import setting_changed
from django.dispatch import receiver

_cache = None
_lock = threading.Lock()


def session_cache():
    global _cache
    with _lock:
        if _cache is None:
            _cache = caches.create_connection(settings.SESSION_CACHE_ALIAS)
        return _cache


@receiver(setting_changed)
def _settings_changed(*, setting, **kwargs) -> None:
    global _cache
    if setting in ("CACHES", "SESSION_CACHE_ALIAS"):
        with _lock:
            _cache = None


class SessionStore(cached_db.SessionStore):
    def __init__(self, session_key=None):
        # cached_db's own __init__ would look up the per-context instance (and make it).
        self._cache = session_cache()
        cached_db.DBStore.__init__(self, session_key)
