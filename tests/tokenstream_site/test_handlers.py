"""Django under daphne: sync views through the all-sync chain in one thread, async views
(the /v1 API) through Django's own chain (tokenstream_site/handlers.py)."""

import asyncio
import sys
import threading
from pathlib import Path

import pytest
from channels.testing import HttpCommunicator
from django.conf import settings

from tokenstream_site.handlers import SyncViewsInOneThread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def handler(monkeypatch):
    handler = SyncViewsInOneThread()
    calls = []
    serve = handler.sync_handler.get_response

    def spy(request):
        calls.append(threading.get_ident())
        return serve(request)

    monkeypatch.setattr(handler.sync_handler, "get_response", spy)
    handler.sync_calls = calls
    return handler


def request(handler, method: str, path: str, body: bytes = b"", headers=None) -> dict:
    headers = [(b"host", b"testserver"), *(headers or [])]
    communicator = HttpCommunicator(handler, method, path, body=body, headers=headers)
    return asyncio.run(communicator.get_response(timeout=10))


def test_a_sync_view_is_served_whole_by_the_sync_chain_in_a_thread(handler):
    response = request(handler, "GET", "/accounts/login/")
    assert response["status"] == 200 and b"password" in response["body"]
    assert len(handler.sync_calls) == 1 and handler.sync_calls[0] != threading.get_ident()


def test_the_sync_chain_keeps_every_middleware(handler):
    # CSRF refuses a form without its token, the API answers JSON to a stranger, and the
    # security headers are set: the middleware ran, in the sync chain.
    refused = request(handler, "POST", "/accounts/login/", b"username=a&password=b")
    assert refused["status"] == 403
    api = request(handler, "GET", "/api/conversations/")
    assert api["status"] == 401 and b"Sign in first." in api["body"]
    assert (b"X-Frame-Options", b"DENY") in api["headers"]
    assert len(handler.sync_calls) == 2


def test_an_unknown_path_is_a_404_from_the_sync_chain(handler):
    assert request(handler, "GET", "/no/such/page/")["status"] == 404
    assert len(handler.sync_calls) == 1


def test_an_async_view_keeps_djangos_chain(handler):
    response = request(handler, "GET", "/v1/models")
    assert response["status"] == 401 and b"error" in response["body"]
    assert handler.sync_calls == []


def test_sync_requests_reuse_the_pools_threads_and_their_database_connections(handler):
    # A thread of its own per request, and a new connection in it, cost a tenth of a send.
    from django.db import connection

    served = []
    serve = handler.sync_handler.get_response

    def spy(request):
        response = serve(request)
        served.append((threading.current_thread(), id(connection.connection)))
        return response

    handler.sync_handler.get_response = spy
    for _ in range(3 * settings.REQUEST_THREADS):
        assert request(handler, "GET", "/api/conversations/")["status"] == 401
    threads = {thread for thread, _ in served}
    assert len(threads) <= settings.REQUEST_THREADS
    assert all(thread.name.startswith("django-request") for thread in threads)
    # Each thread kept the connection it opened (the session read opened one).
    for thread in threads:
        assert len({conn for t, conn in served if t is thread}) == 1


# whitenoise's file iterator is sync: Django warns that it reads it in a thread, as it
# always has for static files under ASGI.
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")
def test_a_streamed_response_is_sent_whole(handler):
    # A static file: whitenoise answers it with a FileResponse, read in pieces.
    async def get() -> tuple[int, bytes]:
        communicator = HttpCommunicator(
            handler, "GET", "/static/chat/app.js", headers=[(b"host", b"testserver")]
        )
        await communicator.send_input({"type": "http.request", "body": b""})
        start = await communicator.receive_output(10)
        body, more = b"", True
        while more:
            message = await communicator.receive_output(10)
            body += message.get("body", b"")
            more = message.get("more_body", False)
        return start["status"], body

    status, body = asyncio.run(get())
    assert status == 200
    assert body == (Path(settings.BASE_DIR) / "static" / "chat" / "app.js").read_bytes()


def test_the_loaded_site_is_left_out_of_the_cyclic_collectors_scans():
    import subprocess

    code = "import gc, tokenstream_site.asgi; print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) > 50_000


def test_the_request_pool_has_as_many_threads_as_the_setting(monkeypatch, settings):
    from tokenstream_site import handlers

    monkeypatch.setattr(handlers, "_executor", None)
    settings.REQUEST_THREADS = 3
    pool = handlers.request_executor()
    try:
        assert pool._max_workers == 3 and handlers.request_executor() is pool
    finally:
        pool.shutdown(wait=False)


@pytest.mark.skipif(sys.platform != "linux", reason="a nice value per thread is Linux's")
def test_request_threads_run_below_the_relays_priority(monkeypatch, settings):
    import os

    from tokenstream_site import handlers

    monkeypatch.setattr(handlers, "_executor", None)
    settings.REQUEST_NICE = 7
    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    pool = handlers.request_executor()
    try:
        thread_nice = pool.submit(
            lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        ).result()
    finally:
        pool.shutdown(wait=False)
    assert thread_nice == min(19, loop_nice + 7)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop_nice
