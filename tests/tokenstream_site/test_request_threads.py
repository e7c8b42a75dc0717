"""Django's sync code runs in reused threads, but never two requests in one thread at once."""

import asyncio
import threading

from asgiref.sync import sync_to_async

from tokenstream_site.request_threads import SUPPORTED, RequestThreads


class RecordThread:
    """An ASGI app that runs thread-sensitive sync code, as Django's handler does."""

    def __init__(self, hold: asyncio.Event | None = None):
        self.hold = hold
        self.threads: list[int] = []

    async def __call__(self, scope, receive, send):
        self.threads.append(await sync_to_async(threading.get_ident)())
        if self.hold is not None:
            await self.hold.wait()
        self.threads.append(await sync_to_async(threading.get_ident)())


def call(app, scope_type: str = "http"):
    return app({"type": scope_type}, None, None)


def test_requests_one_after_another_reuse_one_thread():
    inner = RecordThread()
    app = RequestThreads(inner)

    async def main():
        await call(app)
        await call(app)

    asyncio.run(main())
    assert threading.get_ident() not in inner.threads
    if SUPPORTED:
        assert len(set(inner.threads)) == 1


def test_requests_at_the_same_time_each_have_their_own_thread():
    async def main():
        hold = asyncio.Event()
        inner = RecordThread(hold)
        app = RequestThreads(inner)
        tasks = [asyncio.create_task(call(app)) for _ in range(3)]
        while len(inner.threads) < 3:
            await asyncio.sleep(0.01)
        hold.set()
        await asyncio.gather(*tasks)
        return inner.threads, app

    threads, app = asyncio.run(main())
    first, second = threads[:3], threads[3:]
    assert len(set(first)) == 3 and sorted(first) == sorted(second)
    if SUPPORTED:
        assert len(app.idle) == 3


def test_past_the_idle_limit_threads_are_let_go():
    async def main():
        hold = asyncio.Event()
        app = RequestThreads(RecordThread(hold), keep_idle=1)
        tasks = [asyncio.create_task(call(app)) for _ in range(3)]
        await asyncio.sleep(0.2)
        hold.set()
        await asyncio.gather(*tasks)
        return app

    assert len(asyncio.run(main()).idle) <= 1
