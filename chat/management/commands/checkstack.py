import asyncio
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from chat.management import probes

LAYER_TIMEOUT = 5.0


@dataclass(frozen=True)
class Check:
    ok: bool
    part: str
    detail: str

    @property
    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL'} {self.part}: {self.detail}"


class Command(BaseCommand):
    help = "Check the database, the channel layer and every inference server; exit 1 if any fails."

    def handle(self, *args, **options):
        probes.quiet_http_logs()
        checks = []
        for check in (check_database, check_channel_layer, *_inference_checks()):
            result = check()
            self.stdout.write(result.line)  # as each part answers: a slow one shows where
            checks.append(result)
        failed = [c.part for c in checks if not c.ok]
        if failed:
            raise CommandError(f"{len(failed)} of {len(checks)} parts failed: {', '.join(failed)}.")


def _elapsed_ms(started: float) -> str:
    return f"{(time.monotonic() - started) * 1000:.0f} ms"


def check_database() -> Check:
    part = f"database {connection.vendor} {connection.settings_dict.get('NAME')}"
    started = time.monotonic()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        return Check(False, part, str(exc))
    if pending:
        return Check(False, part, f"{len(pending)} migrations not applied: run `manage.py migrate`")
    return Check(True, part, f"query in {_elapsed_ms(started)}, migrations applied")


def check_channel_layer() -> Check:
    layer = get_channel_layer()
    if layer is None:
        return Check(False, "channel layer", "none configured (CHANNEL_LAYERS)")
    part = f"channel layer {type(layer).__name__}{_redis_where()}"
    started = time.monotonic()
    try:
        asyncio.run(_round_trip(layer))
    except TimeoutError:
        return Check(False, part, f"a message sent was not received in {LAYER_TIMEOUT:.0f} s")
    except (OSError, ConnectionError) as exc:
        return Check(False, part, str(exc) or type(exc).__name__)
    except Exception as exc:  # redis errors have no common base with OSError
        return Check(False, part, f"{type(exc).__name__}: {exc}")
    # In memory, the layer only reaches this process: say so, it is not a fault on one machine.
    scope = "" if settings.REDIS_URL else " (in memory: one process only)"
    return Check(True, part, f"send/receive round trip in {_elapsed_ms(started)}{scope}")


def _redis_where() -> str:
    if not settings.REDIS_URL:
        return ""
    url = urlsplit(settings.REDIS_URL)
    return f" {url.scheme}://{url.hostname}:{url.port or 6379}"  # never print a password


async def _round_trip(layer) -> None:
    try:
        channel = await layer.new_channel("checkstack.")
        nonce = uuid.uuid4().hex
        await layer.send(channel, {"type": "checkstack.ping", "nonce": nonce})
        async with asyncio.timeout(LAYER_TIMEOUT):
            received = await layer.receive(channel)
        if received.get("nonce") != nonce:
            raise OSError("received a different message than was sent")
    finally:
        # Redis pools are bound to this event loop, which ends here.
        if hasattr(layer, "close_pools"):
            await layer.close_pools()


def _inference_checks():
    return [lambda url=url: check_inference(url) for url in settings.INFERENCE_URLS]


def check_inference(url: str) -> Check:
    part = f"inference {url}"
    try:
        health = probes.get(url, "/health")
    except httpx.HTTPError as exc:
        return Check(False, part, probes.describe(exc))
    if health.status_code != 200:
        return Check(False, part, f"/health answered HTTP {health.status_code}")
    state = probes.ready_state(url)
    if not state.ready:
        why = f": {state.error}" if state.error else ""
        return Check(False, part, f"healthy but not ready ({state.status}{why})")
    return Check(True, part, f"healthy, ready, model {state.model or '(unknown)'}")
