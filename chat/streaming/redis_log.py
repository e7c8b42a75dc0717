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

import hashlib
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

# ARGV: limit, clock base, idle seconds, topic, origin, key prefix, and then the events in one
# argument: channel, type and data of each, each followed by a newline (channel names, event
# types and JSON data hold none). One argument however many events: packing five arguments
# an event was most of the site's cost of a batch. The keys are made here from the channel names
# (KEY_PREFIX, as _keys makes them), which a single Redis server allows; the site does not
# run on Redis Cluster (pub/sub and this one script over many channels assume one server).
# Announces "origin" and then id, channel, type and data of each event, one per line, and
# returns the ids, separated by spaces.
APPEND_MANY = """
local limit, base, idle, topic = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local prefix, ids, out, logs = ARGV[6], {}, {ARGV[5]}, {}
for channel, event_type, data in string.gmatch(ARGV[7], '([^\\n]*)\\n([^\\n]*)\\n([^\\n]*)\\n') do
  local id_key, log_key = prefix .. channel .. ':id', prefix .. channel .. ':log'
  if logs[log_key] == nil then
    if redis.call('EXISTS', id_key) == 0 then redis.call('SET', id_key, base) end
    logs[log_key] = id_key
  end
  local id = redis.call('INCR', id_key)
  local text = string.format('%.0f', id)
  redis.call('ZADD', log_key, id, text .. '\\n' .. event_type .. '\\n' .. data)
  ids[#ids + 1] = text
  out[#out + 1] = text .. '\\n' .. channel .. '\\n' .. event_type .. '\\n' .. data
end
for log_key, id_key in pairs(logs) do
  local extra = redis.call('ZCARD', log_key) - limit
  if extra > 0 then redis.call('ZREMRANGEBYRANK', log_key, 0, extra - 1) end
  redis.call('EXPIRE', id_key, idle)
  redis.call('EXPIRE', log_key, idle)
end
redis.call('PUBLISH', topic, table.concat(out, '\\n'))
return table.concat(ids, ' ')
"""
APPEND_MANY_SHA = hashlib.sha1(APPEND_MANY.encode()).hexdigest()

CURRENT = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
return tonumber(redis.call('GET', KEYS[1]))
"""


KEY_PREFIX = "tokenstream:events:"


def _keys(channel: str) -> list[str]:
    return [f"{KEY_PREFIX}{channel}:id", f"{KEY_PREFIX}{channel}:log"]


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


def append_many_args(events: list[tuple[str, str, str]], origin: str) -> list:
    """APPEND_MANY's arguments for (channel, type, data) events, none of which holds a
    newline (the publisher refuses those)."""
    blob = "".join([f"{channel}\n{event_type}\n{data}\n" for channel, event_type, data in events])
    limit = settings.EVENTLOG_MAX_EVENTS_PER_CHANNEL
    return [limit, _clock_base(), IDLE_SECONDS, TOPIC, origin, KEY_PREFIX, blob]


def announced(payload: bytes) -> tuple[str, list[Event]]:
    """An APPEND_MANY announcement: its origin, and its events in id order."""
    lines = payload.decode().split("\n")
    return lines[0], [
        Event(lines[i + 1], lines[i + 2], lines[i + 3], id=int(lines[i]))
        for i in range(1, len(lines), 4)
    ]
