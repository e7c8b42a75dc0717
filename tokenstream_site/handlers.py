"""Django under ASGI, with its sync views served as under WSGI.

Django builds one middleware chain for ASGI, async at its innermost end. With this site's
middleware (all able to run sync, and one that can only), a sync view's request goes from
the event loop to a worker thread (the middleware), back to the loop (URL resolving, the
view middleware), to the thread again (the view) and back twice more on the way out: four
hand-overs between threads where one pair does. Sync views (every page and the site JSON
API) therefore run through a second, all-sync chain, whole in the request's one thread, as
WSGI runs it. Async views (the /v1 API, which streams from the loop) keep Django's chain.
"""

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.urls import Resolver404, get_resolver


class SyncViewsInOneThread(ASGIHandler):
    def __init__(self):
        super().__init__()
        # Its own middleware instances: each chain's view and exception middleware lists
        # hold methods adapted to that chain's mode.
        self.sync_handler = BaseHandler()
        self.sync_handler.load_middleware(is_async=False)

    async def get_response_async(self, request):
        if _serves_async(request.path_info):
            return await super().get_response_async(request)
        return await sync_to_async(self.sync_handler.get_response, thread_sensitive=True)(request)


def _serves_async(path: str) -> bool:
    """Whether the view of `path` is async. A path that resolves to nothing takes the sync
    chain (its middleware answer it, as they would in Django's chain)."""
    try:
        match = get_resolver().resolve(path)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)
