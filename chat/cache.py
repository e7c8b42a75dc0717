"""Django's Redis cache, with one redis-py client per connection pool instead of one per call.

Django's RedisCacheClient.get_client builds a new `redis.Redis` for every cache operation
(over the same pool), and redis-py's constructor fills a table of ~200 response callbacks
each time: half of a session read's CPU, on every request of the scaled-out site (py-spy,
bench/README.md, issue 18's nineteenth round). A client over a pool is safe to share
between threads, so one is made per pool and kept.
"""

from django.core.cache.backends import redis as django_redis


class ClientPerPool(django_redis.RedisCacheClient):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(pool)
        if client is None:
            client = self._clients.setdefault(pool, self._client(connection_pool=pool))
        return client


class RedisCache(django_redis.RedisCache):
    """settings.CACHES' BACKEND with REDIS_URL: Django's RedisCache over ClientPerPool."""

    def __init__(self, server, params) -> None:
        super().__init__(server, params)
        self._class = ClientPerPool
