"""Django's sync code in reused threads, one request at a time each.

Under ASGI, asgiref gives every request's context a new single-thread executor: a new OS
thread per request, and with it a new database connection (Django keeps one per thread),
so every request built a DatabaseWrapper, opened SQLite, ran its PRAGMAs and closed it
again. In bench.relay's profile of a burst of sends that was about a tenth of the CPU.

Here each request still has a thread of its own for as long as it runs (what asgiref's
per-request executor guarantees; a shared thread broke the streaming /v1 view), but the
thread comes from a pool of idle ones and goes back when the request ends, with its
database connection (CONN_MAX_AGE for SQLite; PostgreSQL's pool works as before). A burst
creates as many threads as it needs; at most KEEP_IDLE wait for the next requests.
"""

import inspect
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext

KEEP_IDLE = 64
# asgiref 3.13 added executor=: older versions keep a thread per request.
SUPPORTED = "executor" in inspect.signature(ThreadSensitiveContext).parameters


class RequestThreads:
    """ASGI middleware around Django's application. Only the event loop's thread takes and
    gives back executors, so the idle list needs no lock."""

    def __init__(self, app, keep_idle: int = KEEP_IDLE):
        self.app = app
        self.keep_idle = keep_idle
        self.idle: list[ThreadPoolExecutor] = []

    async def __call__(self, scope, receive, send):
        if not SUPPORTED or scope["type"] != "http":
            return await self.app(scope, receive, send)
        executor = self.idle.pop() if self.idle else self._new()
        try:
            async with ThreadSensitiveContext(executor=executor):
                return await self.app(scope, receive, send)
        finally:
            self._give_back(executor)

    def _new(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="django-request")

    def _give_back(self, executor: ThreadPoolExecutor) -> None:
        if len(self.idle) < self.keep_idle:
            self.idle.append(executor)
        else:
            executor.shutdown(wait=False)
