"""ASGI entry point for daphne: Channels' protocol router around Django, and the relay
manager started on the server's event loop before the first request is handled."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tokenstream_site.settings")

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_application = get_asgi_application()

from chat.relay import relay_manager  # noqa: E402


class StartRelays:
    """Hands the relay manager the server's loop: relays and their writer run there."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        relay_manager.ensure_started()
        return await self.app(scope, receive, send)


application = StartRelays(ProtocolTypeRouter({"http": django_application}))
