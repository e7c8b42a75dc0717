"""Event log cost, side by side: publishing a token event to a waiting listener through our
in-memory log (what the relay does per event) vs django-eventstream's DjangoModelStorage on
SQLite on disk (a transaction per event), and vs our Redis log when REDIS_URL is set.

    .venv/bin/python -m bench.eventlog
"""

import asyncio
import json
import os
import tempfile
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tokenstream_site.settings")
os.environ["TOKENSTREAM_VAR_DIR"] = tempfile.mkdtemp()
os.environ.pop("REDIS_URL", None)

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

# The storage we replaced, measured beside ours (the project itself never uses it).
from django_eventstream.storage import DjangoModelStorage  # noqa: E402

from chat.streaming.channels import channel_for  # noqa: E402
from chat.streaming.eventstream import Subscription  # noqa: E402
from chat.streaming.publish import publish_on_loop  # noqa: E402

CONVERSATION = "0" * 32

DATA = {"message_id": "0" * 36, "seq": 0, "text": " word"}


async def memory_rate(count: int) -> float:
    subscription = Subscription(channel_for(CONVERSATION), user_id=None)
    subscription.open()
    try:
        start = time.perf_counter()
        for _ in range(count):
            publish_on_loop(CONVERSATION, "token", DATA)
            subscription.take()  # the stream consumes as it goes
        return count / (time.perf_counter() - start)
    finally:
        subscription.close()


def storage_rate(storage, count: int) -> float:
    payload = json.dumps(DATA)
    start = time.perf_counter()
    for _ in range(count):
        storage.append_event(channel_for(CONVERSATION), "token", payload)
    return count / (time.perf_counter() - start)


def main() -> None:
    call_command("migrate", verbosity=0)
    memory = asyncio.run(memory_rate(50000))
    model = storage_rate(DjangoModelStorage(), 300)
    print(
        f"in-memory log, publish to a listener: {memory:10.0f} events/s ({1e6 / memory:.1f} us/event)"
    )
    print(
        f"DjangoModelStorage on SQLite (disk):  {model:10.0f} events/s ({1e3 / model:.2f} ms/event)"
    )
    print(f"ratio: {memory / model:.0f}x")
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
    try:
        from django.conf import settings

        settings.REDIS_URL = redis_url
        from chat.streaming.redis_log import RedisEventStorage

        rate = storage_rate(RedisEventStorage(), 3000)
        print(
            f"Redis log (append, one round trip):   {rate:10.0f} events/s ({1e3 / rate:.2f} ms/event)"
        )
    except Exception as exc:  # Redis is optional here
        print(f"Redis log: skipped ({exc.__class__.__name__}: {exc})")


if __name__ == "__main__":
    main()
