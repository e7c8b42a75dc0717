"""How many event streams this process holds open, per user and in all.

Each open stream holds a socket, one of the process's open files. One user with 300 streams
used up a limit of 256, and every other request of the process failed until they closed.
A user gets EVENTS_MAX_STREAMS_PER_USER (a few tabs each following a conversation), the
process EVENTS_MAX_STREAMS, by default half its open-file limit, which leaves the other half
for database, Redis and inference connections and ordinary requests.

Only the event loop's thread takes and gives back slots, so no lock is needed.
"""

import resource
from collections import Counter

from django.conf import settings

DEFAULT_WITHOUT_FILE_LIMIT = 10000

_open: Counter = Counter()


def process_limit() -> int:
    if settings.EVENTS_MAX_STREAMS > 0:
        return settings.EVENTS_MAX_STREAMS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return DEFAULT_WITHOUT_FILE_LIMIT if soft == resource.RLIM_INFINITY else max(1, soft // 2)


def take(user_id) -> tuple[int, str] | None:
    """A slot for one more stream of this user, or (HTTP status, why) when there is none."""
    per_user = settings.EVENTS_MAX_STREAMS_PER_USER
    if _open[user_id] >= per_user:
        return 429, (
            f"Too many open event streams for your account ({per_user}). "
            "Close other tabs of this site and reload.\n"
        )
    if _open.total() >= process_limit():
        return 503, "The site is serving as many event streams as it can. Try again in a moment.\n"
    _open[user_id] += 1
    return None


def give_back(user_id) -> None:
    _open[user_id] -= 1
    if _open[user_id] <= 0:
        del _open[user_id]


def open_streams() -> int:
    return _open.total()
