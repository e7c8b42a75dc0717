"""Django's Redis cache, with one redis-py client per connection pool instead of one per
call, and a lean GET.

Django's RedisCacheClient.get_client builds a new `redis.Redis` for every cache operation
(over the same pool), and redis-py's constructor fills a table of ~200 response callbacks
each time: half of a session read's CPU, on every request of the scaled-out site (py-spy,
bench/README.md, issue 18's nineteenth round). A client over a pool is safe to share
between threads, so one is made per pool and kept.

Every request of the scaled-out site reads its session with a GET: through redis-py that
cost ~78 µs of CPU on an idle machine and ~0.4 ms during a burst of sends (its connection
pool's checks, retry wrapper and reply parser), over a connection of its own ~21 µs. So
GET sends RESP2 itself (chat/streaming/resp.py's pack and parse) on connections that
redis-py made (its connect: the URL's TLS, password and database), kept in a free list
shared by the process's threads. Anything unexpected (a connection that closed, an error
reply) drops that connection and asks redis-py instead, which reconnects or raises as it
always did.
"""

import threading

import redis
from django.core.cache.backends import redis as django_redis

from chat.streaming.resp import Incomplete, RedisError, pack, parse


class ClientPerPool(django_redis.RedisCacheClient):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._clients = {}
        self._lean = {}
        self._making = threading.Lock()

    def _get_connection_pool(self, write):
        # Django's makes a pool the first time an index is asked for, unlocked: threads that
        # ask at once each made one (and so a client each), of which only the last was kept
        index = self._get_connection_pool_index(write)
        pool = self._pools.get(index)
        if pool is None:
            with self._making:
                pool = super()._get_connection_pool(write)
        return pool

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(pool)
        if client is None:
            client = self._clients.setdefault(pool, self._client(connection_pool=pool))
        return client

    def get(self, key, default):
        pool = self._get_connection_pool(False)
        lean = self._lean.get(pool) or self._lean.setdefault(pool, LeanGets(pool))
        try:
            value = lean.get(key)
        except (OSError, redis.RedisError, RedisError, ValueError):
            return super().get(key, default)
        return default if value is None else self._serializer.loads(value)


class LeanGets:
    """GET over RESP2 connections made like the pool's own, each used by one thread at a
    time: list.pop and list.append are atomic, so the free list needs no lock."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self.pool = pool
        self.free: list = []

    def get(self, key: str) -> bytes | None:
        try:
            connection = self.free.pop()
        except IndexError:
            connection = self._connect()
        try:
            value = _call(connection._sock, pack(("GET", key)))
        except BaseException:
            connection.disconnect()
            raise
        self.free.append(connection)
        if isinstance(value, RedisError):
            raise value
        return value

    def _connect(self):
        connection = self.pool.make_connection()
        connection.connect()
        return connection


def _call(sock, command: bytes):
    if sock is None:
        raise ConnectionError("not connected to Redis")
    sock.sendall(command)
    buffer = bytearray()
    while True:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("Redis closed the connection")
        buffer += data
        try:
            value, end = parse(buffer)
        except Incomplete:
            continue
        if end != len(buffer):
            raise ValueError("more than one reply to one GET")
        return value


class RedisCache(django_redis.RedisCache):
    """settings.CACHES' BACKEND with REDIS_URL: Django's RedisCache over ClientPerPool."""

    def __init__(self, server, params) -> None:
        super().__init__(server, params)
        self._class = ClientPerPool
