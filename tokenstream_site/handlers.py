"""Django under ASGI, with its sync views served as under WSGI.

Django builds one middleware chain for ASGI, async at its innermost end. With this site's
middleware (all able to run sync, and one that can only), a sync view's request goes from
the event loop to a worker thread (the middleware), back to the loop (URL resolving, the
view middleware), to the thread again (the view) and back twice more on the way out: four
hand-overs between threads where one does. Sync views (every page and the site JSON API)
therefore run through a second, all-sync chain, as WSGI runs it: the request's start signal,
its middleware and view, and (for a response that is not streamed) its end signal in one
call to a thread of a small pool kept for the process's life.

Not a thread of its own per request, as Django's ASGI handler gives it (asgiref's
ThreadSensitiveContext): creating and joining that thread, and opening a new database
connection in it, were a tenth of a send's CPU. A pool thread keeps its connection from one
request to the next (`_keep_connection`), as a WSGI worker does with CONN_MAX_AGE; a
connection that failed or left autocommit is still closed at the request's end by Django.
Async views (the /v1 API, which streams from the loop) keep Django's chain and its thread
per request: a shared thread there broke its streaming ("CurrentThreadExecutor already quit
or is broken").
"""

import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from django.http import FileResponse
from django.urls import Resolver404, get_resolver, set_script_prefix

log = logging.getLogger("tokenstream_site.handlers")
_pool_thread = threading.local()
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def request_executor() -> ThreadPoolExecutor:
    """The process's pool of request threads (settings.REQUEST_THREADS), made at the first
    sync request. More requests than threads wait their turn on the loop.

    Few threads, because the relay runs on the event loop's thread and competes with them
    for the GIL: a thread that wants it back waits for the holder's switch interval (5 ms),
    and then the GIL may go to any of the waiting threads. During a burst of sends, 8
    CPU-bound request threads kept the relayed tokens waiting: on PostgreSQL + Redis, 200
    streams on one process had a p99 of +72 and +107 ms over reading the inference server
    directly with 8 threads, +16 and +11 ms with 2, and the sends' first tokens came no later
    (bench/README.md, issue 18's sixth round). And at a lower priority than the relay
    (`_lower_priority`)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=settings.REQUEST_THREADS,
                thread_name_prefix="django-request",
                initializer=_mark_pool_thread,
            )
        return _executor


def _mark_pool_thread() -> None:
    _pool_thread.keeps_connections = True
    _lower_priority(settings.REQUEST_NICE)


def _lower_priority(nice: int) -> None:
    """This thread's nice value raised by `nice` (settings.REQUEST_NICE), so that when the
    cores are short the OS runs the event loop's thread, which relays every open reply,
    before the requests'. During a burst of 400 sends to two processes on 2 cores (PostgreSQL
    + Redis) the relayed tokens' p99 over reading the inference server directly was +474 and
    +603 ms with the request threads at the loop's priority, +10 and +38 ms at nice 10, and
    the sends' first tokens came no later (bench/README.md, issue 18's seventh round). Linux
    keeps a nice value per thread; elsewhere setpriority would lower the whole process."""
    if not nice or sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(
            os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + nice)
        )
    except OSError as error:  # a sandbox may refuse it: run at the loop's priority
        log.warning("request threads keep their priority: %s", error)


@receiver(connection_created)
def _keep_connection(sender, connection, **kwargs) -> None:
    """A connection opened in a pool thread is not obsolete at the request's end
    (CONN_MAX_AGE is 0 for the threads that end with their request)."""
    if getattr(_pool_thread, "keeps_connections", False):
        connection.close_at = None


class SyncViewsInOneThread(ASGIHandler):
    def __init__(self):
        super().__init__()
        # Its own middleware instances: each chain's view and exception middleware lists
        # hold methods adapted to that chain's mode.
        self.sync_handler = BaseHandler()
        self.sync_handler.load_middleware(is_async=False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or _serves_async(_path_info(scope)):
            return await super().__call__(scope, receive, send)
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            serve = sync_to_async(self.serve, thread_sensitive=False, executor=request_executor())
            response = await serve(scope, body_file)
            if not response.streaming:
                await self.send_response(response, send)
                return
            # A streamed response (a static file) is read and closed as Django's chain
            # does, in a thread of its own: not in a pool thread for as long as it lasts.
            async with ThreadSensitiveContext():
                try:
                    await self.send_response(response, send)
                finally:
                    await sync_to_async(response.close)()
        finally:
            body_file.close()

    def serve(self, scope, body_file):
        """The request from its start signal to its response, in a pool thread; a response
        that is not streamed is closed here too (its end signal: this thread's database
        connection), before it is sent."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.sync_handler.get_response(request)
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        response._handler_class = self.__class__
        if not response.streaming:
            response.close()
        return response


def _path_info(scope) -> str:
    """The path Django resolves (as ASGIRequest.path_info)."""
    return scope["path"].removeprefix(get_script_prefix(scope))


def _serves_async(path: str) -> bool:
    """Whether the view of `path` is async. A path that resolves to nothing takes the sync
    chain (its middleware answer it, as they would in Django's chain)."""
    try:
        match = get_resolver().resolve(path)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)
