"""The Redis cache backend (chat/cache.py): one redis-py client per connection pool, shared
by every call and thread, and the cache behaving as Django's. Skipped when Redis is absent."""

import threading
import time
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


def test_threads_asking_for_the_first_time_at_once_share_one_pool_and_client():
    """Django makes a pool on first use without a lock: threads that asked at the same
    moment each got a pool and a client of their own (a flaky failure of the test above)."""
    require_redis(REDIS_URL)
    for _ in range(20):
        cache = RedisCache(REDIS_URL, {"KEY_PREFIX": f"cache-test-{uuid.uuid4().hex}"})
        start, seen = threading.Barrier(8), []
        slow = cache._cache._pool_class.from_url

        def from_url(*args, slow=slow, **kwargs):
            time.sleep(0.002)  # as a real pool's construction yields to other threads
            return slow(*args, **kwargs)

        base = cache._cache._pool_class
        cache._cache._pool_class = type("SlowPool", (base,), {"from_url": staticmethod(from_url)})

        def use(cache=cache, start=start, seen=seen):
            start.wait()
            seen.append(cache._cache.get_client())

        threads = [threading.Thread(target=use) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len({id(client) for client in seen}) == 1


def test_values_set_are_read_back_counted_and_deleted_as_djangos_cache_does(cache):
    cache.set("session", {"user": 7}, timeout=60)
    assert cache.get("session") == {"user": 7}
    assert cache.add("session", "other") is False
    cache.set("count", 1)
    assert cache.incr("count", 2) == 3
    cache.delete("session")
    assert cache.get("session", "gone") == "gone"


def _lean(cache):
    (lean,) = cache._cache._lean.values()
    return lean


def test_a_get_reads_over_a_lean_connection_kept_for_the_next(cache):
    cache.set("session", {"user": 7}, timeout=60)
    assert cache.get("session") == {"user": 7}
    assert cache.get("missing", "default") == "default"
    assert len(_lean(cache).free) == 1  # one connection, used twice and kept


def test_the_lean_get_uses_the_urls_password_and_database(redis_with_password):
    port = redis_with_password
    url = f"redis://:s3cret@127.0.0.1:{port}/3"
    writer = RedisCache(url, {"KEY_PREFIX": "p"})
    writer.set("session", "in three", timeout=60)
    assert RedisCache(url, {"KEY_PREFIX": "p"}).get("session") == "in three"
    other_database = RedisCache(f"redis://:s3cret@127.0.0.1:{port}/0", {"KEY_PREFIX": "p"})
    assert other_database.get("session") is None


def test_a_get_after_redis_closed_the_connection_still_reads_and_reconnects(cache):
    cache.set("session", "kept", timeout=60)
    assert cache.get("session") == "kept"
    (connection,) = _lean(cache).free
    connection._sock.close()  # what a Redis restart leaves behind
    assert cache.get("session") == "kept"  # redis-py answered this one
    assert cache.get("session") == "kept"
    (fresh,) = _lean(cache).free
    assert fresh is not connection


def test_threads_reading_at_once_each_get_their_own_value(cache):
    for n in range(8):
        cache.set(f"key{n}", n, timeout=60)
    wrong = []

    def read(n):
        for _ in range(200):
            if cache.get(f"key{n}") != n:
                wrong.append(n)

    threads = [threading.Thread(target=read, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert 1 <= len(_lean(cache).free) <= 8
