"""The local Redis server, for tests of the scaled-out setup."""

import pytest

REDIS_URL = "redis://127.0.0.1:6379/5"


def require_redis(url: str = REDIS_URL) -> str:
    """`url` once its server answers a PING; else the test skips, saying why."""
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis is not running at 127.0.0.1:6379 ({exc})")
    return url
