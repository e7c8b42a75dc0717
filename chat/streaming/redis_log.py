"""The event log in Redis, for several site processes: every process appends to and replays
from the same log, so a browser can resume on any of them.

django-eventstream's own RedisStorage skips expired events silently and restarts ids at 1
when a channel's counter expires, which can make an old Last-Event-ID look current. Here a
channel's ids start at the microsecond clock like the in-memory log, the log keeps the last
EVENTLOG_MAX_EVENTS_PER_CHANNEL events, and an id outside it gives stream-reset.
"""

import time

import redis
from django.conf import settings

from chat.streaming.eventstream import Event, EventDoesNotExist, StorageBase

IDLE_SECONDS = 24 * 3600

APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[4]) end
local id = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], id, string.format('%.0f', id) .. '\\n' .. ARGV[1] .. '\\n' .. ARGV[2])
local extra = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, extra - 1) end
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return id
"""

CURRENT = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
return tonumber(redis.call('GET', KEYS[1]))
"""


def _keys(channel: str) -> list[str]:
    return [f"tokenstream:events:{channel}:id", f"tokenstream:events:{channel}:log"]


def _clock_base() -> int:
    return time.time_ns() // 1000


class RedisEventStorage(StorageBase):
    def __init__(self) -> None:
        self.redis = redis.Redis.from_url(settings.REDIS_URL)
        self.append = self.redis.register_script(APPEND)
        self.current = self.redis.register_script(CURRENT)

    def append_event(self, channel, event_type, data):
        limit = settings.EVENTLOG_MAX_EVENTS_PER_CHANNEL
        event_id = self.append(
            keys=_keys(channel), args=[event_type, data, limit, _clock_base(), IDLE_SECONDS]
        )
        return Event(channel, event_type, data, id=int(event_id))

    def get_current_id(self, channel):
        return int(self.current(keys=_keys(channel)[:1], args=[_clock_base(), IDLE_SECONDS]))

    def get_events(self, channel, last_id, limit=100):
        current = self.get_current_id(channel)
        if last_id == current:
            return []
        log_key = _keys(channel)[1]
        oldest = self.redis.zrange(log_key, 0, 0, withscores=True)
        if last_id > current or not oldest or last_id < int(oldest[0][1]) - 1:
            raise EventDoesNotExist(f"No such event {last_id}", current)
        members = self.redis.zrangebyscore(log_key, f"({last_id}", "+inf", start=0, num=limit)
        return [_event(channel, member) for member in members]


def _event(channel: str, member: bytes) -> Event:
    event_id, event_type, data = member.decode().split("\n", 2)
    return Event(channel, event_type, data, id=int(event_id))
