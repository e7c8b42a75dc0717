"""The Redis cache backend (chat/cache.py): one redis-py client per connection pool, shared
by every call and thread, and the cache behaving as Django's. Skipped when Redis is absent."""

import threading
import uuid

import pytest

from chat.cache import RedisCache
from tests.support.redis_server import REDIS_URL, require_redis


@pytest.fixture
def cache():
    require_redis(REDIS_URL)
    return RedisCache(REDIS_URL, {"KEY_PREFIX": f"cache-test-{uuid.uuid4().hex}"})


def test_every_call_and_thread_uses_one_client_of_the_pool(cache):
    seen = []

    def use():
        seen.append(cache._cache.get_client())
        seen.append(cache._cache.get_client(write=True))

    threads = [threading.Thread(target=use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    use()
    assert len({id(client) for client in seen}) == 1


def test_values_set_are_read_back_counted_and_deleted_as_djangos_cache_does(cache):
    cache.set("session", {"user": 7}, timeout=60)
    assert cache.get("session") == {"user": 7}
    assert cache.add("session", "other") is False
    cache.set("count", 1)
    assert cache.incr("count", 2) == 3
    cache.delete("session")
    assert cache.get("session", "gone") == "gone"
