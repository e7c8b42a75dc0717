"""Counters in the cache for limits without a database row to lock (sign-in, sign-up).

Each step is atomic in every Django cache backend (add, incr), so simultaneous requests
each get their own count: a request counts itself before it does the limited thing, never
after (counting after let 20 simultaneous password guesses all through). With REDIS_URL the
cache is Redis and the counts are shared by every site process."""

import hashlib
import time

from django.core.cache import cache


def digest(text: str) -> str:
    """A cache-safe key part for user-supplied text (any length, any characters)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def hit(key: str, window: int) -> int:
    """One more in a window of `window` seconds from the first; returns the new count."""
    cache.add(key, 0, window)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 0, window)
        count = cache.incr(key)
    if count == 1:
        # Redis' INCR on a key that expired after Django's existence check creates it
        # without an expiry: a counter that would never be forgotten.
        cache.touch(key, window)
    return count


def unhit(key: str) -> None:
    try:
        cache.decr(key)
    except ValueError:
        pass


def lock(key: str, seconds: float) -> None:
    cache.set(key, time.time() + seconds, max(1, int(seconds) + 1))


def locked_for(key: str) -> float:
    """Seconds left on a lock set with `lock`, 0 when there is none."""
    until = cache.get(key)
    return max(0.0, until - time.time()) if until else 0.0
