"""The event log in Redis, for several site processes: every process appends to and replays
from the same log, so a browser can resume on any of them.

django-eventstream's own RedisStorage skips expired events silently and restarts ids at 1
when a channel's counter expires, which can make an old Last-Event-ID look current. Here a
channel's ids start at the microsecond clock like the in-memory log, the log keeps the last
EVENTLOG_MAX_EVENTS_PER_CHANNEL events, and an id outside it gives stream-reset.

Publishing (chat/streaming/delivery.py) appends a batch of events and announces them to
every site process in one script (APPEND_MANY): one round trip and one pub/sub message for
every event of a loop turn, where django-eventstream's send_event made two round trips per
event from a worker thread. Appending and publishing in one script also keeps the pub/sub
order the log's id order.
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

# KEYS: each event's channel keys (_keys); ARGV: limit, clock base, idle seconds, topic,
# origin, then channel, type and data of each event. Announces "origin" and then id,
# channel, type and data of each event, one per line (event types, channel names and JSON
# data hold no newline), and returns the ids.
APPEND_MANY = """
local limit, base, idle = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local ids, out, logs = {}, {ARGV[5]}, {}
for i = 1, #KEYS / 2 do
  local id_key, log_key = KEYS[2 * i - 1], KEYS[2 * i]
  local channel, event_type, data = ARGV[3 * i + 3], ARGV[3 * i + 4], ARGV[3 * i + 5]
  if logs[log_key] == nil then
    if redis.call('EXISTS', id_key) == 0 then redis.call('SET', id_key, base) end
    logs[log_key] = id_key
  end
  local id = redis.call('INCR', id_key)
  local text = string.format('%.0f', id)
  redis.call('ZADD', log_key, id, text .. '\\n' .. event_type .. '\\n' .. data)
  ids[i] = id
  out[#out + 1] = text .. '\\n' .. channel .. '\\n' .. event_type .. '\\n' .. data
end
for log_key, id_key in pairs(logs) do
  local extra = redis.call('ZCARD', log_key) - limit
  if extra > 0 then redis.call('ZREMRANGEBYRANK', log_key, 0, extra - 1) end
  redis.call('EXPIRE', id_key, idle)
  redis.call('EXPIRE', log_key, idle)
end
redis.call('PUBLISH', ARGV[4], table.concat(out, '\\n'))
return ids
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


# The pub/sub topic of APPEND_MANY's announcements (django-eventstream's own is
# "events_channel", with one JSON message per event).
TOPIC = "tokenstream:events"


def append_many_args(events: list[tuple[str, str, str]], origin: str) -> tuple[list, list]:
    """APPEND_MANY's keys and args for (channel, type, data) events."""
    keys = []
    args = [settings.EVENTLOG_MAX_EVENTS_PER_CHANNEL, _clock_base(), IDLE_SECONDS, TOPIC, origin]
    for channel, event_type, data in events:
        keys += _keys(channel)
        args += (channel, event_type, data)
    return keys, args


def announced(payload: bytes) -> tuple[str, list[Event]]:
    """An APPEND_MANY announcement: its origin, and its events in id order."""
    lines = payload.decode().split("\n")
    return lines[0], [
        Event(lines[i + 1], lines[i + 2], lines[i + 3], id=int(lines[i]))
        for i in range(1, len(lines), 4)
    ]
