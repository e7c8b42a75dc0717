"""ASGI entry point for daphne: Channels' protocol router around Django. Event streams
are served by chat.streaming.sse without Django's per-request thread; everything else by
Django (its sync views in one thread each: tokenstream_site/handlers.py).
The relay manager starts on the server's event loop before the first request."""

import asyncio
import gc
import os
import signal

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tokenstream_site.settings")

import django  # noqa: E402

django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application does first

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from tokenstream_site.handlers import SyncViewsInOneThread  # noqa: E402

django_application = SyncViewsInOneThread()

from chat.relay.manager import relay_manager  # noqa: E402
from chat.streaming import delivery  # noqa: E402
from chat.streaming.channels import EVENTS_ROUTE  # noqa: E402
from chat.streaming.sse import ConversationEvents, KeepServerSend  # noqa: E402


class StartRelays:
    """Hands the relay manager the server's loop: relays and their writer run there."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        relay_manager.ensure_started()
        delivery.start(relay_manager.loop)
        return await self.app(scope, receive, send)


http = URLRouter(
    [
        path(EVENTS_ROUTE, KeepServerSend(AuthMiddlewareStack(ConversationEvents()))),
        re_path(r"", django_application),
    ]
)

application = StartRelays(ProtocolTypeRouter({"http": http}))

# Django, its apps and this router live as long as the process: out of the cyclic
# collector's scans, whose full pass over them took ~60 ms (117,000 objects), a pause for
# every stream of the process whenever it ran
gc.collect()  # no garbage is frozen with it
gc.freeze()


def _dump_tasks(signum, frame):
    """`kill -USR1 <pid>` prints where every asyncio task of the site waits (support aid)."""
    import sys

    loop = relay_manager.loop
    if loop is None:
        return
    for task in asyncio.all_tasks(loop):
        task.print_stack(limit=12, file=sys.stderr)


signal.signal(signal.SIGUSR1, _dump_tasks)
