"""Inference client backends: one contract, run against each implementation (the in-process
fake, and httpx against a real `python -m inference`), then the HTTP client's failures."""

import asyncio
import contextlib

import pytest

from chat.inference_client import ChatRequest, Delta, Finish, InferenceError
from chat.inference_client.fake import FakeInferenceClient
from chat.inference_client.http import HttpInferenceClient
from tests.support.processes import free_port
from tests.support.scripted_server import ScriptedServer

QUESTION = [{"role": "user", "content": "one two three four five"}]


class Drained(list):
    """A stream's items in arrival order; `handed`: the Deltas among them that came
    through on_delta."""

    handed: list


async def drain(client, request, hand: bool = False) -> Drained:
    """Every item in arrival order; with hand, Deltas go to on_delta where the backend can."""
    items = Drained()
    items.handed = []

    def on_delta(text, produced_at):
        items.handed.append(Delta(text, produced_at))
        items.append(items.handed[-1])

    stream = client.stream_chat(request, on_delta=on_delta) if hand else client.stream_chat(request)
    async with contextlib.aclosing(stream):
        async for item in stream:
            items.append(item)
    return items


@pytest.fixture(params=["yielded", "handed"])
def hand(request) -> bool:
    """Deltas as the stream's items, or handed to on_delta where the backend does that."""
    return request.param == "handed"


@pytest.fixture(params=["fake", "http"])
def backend(request, settings):
    settings.FAKE_TOKENS_PER_SECOND = 200
    if request.param == "fake":
        return FakeInferenceClient()
    server = request.getfixturevalue("fake_inference")
    settings.INFERENCE_URLS = [server.url]
    return HttpInferenceClient()


class TestInferenceClientContract:
    def test_streams_deltas_then_one_finish(self, backend, hand):
        items = asyncio.run(drain(backend, ChatRequest(messages=QUESTION), hand))
        assert all(isinstance(i, Delta) for i in items[:-1])
        assert isinstance(items[-1], Finish) and items[-1].reason == "stop"
        assert "".join(i.text for i in items[:-1]) == "one two three four five"

    def test_max_tokens_ends_with_length(self, backend, hand):
        items = asyncio.run(drain(backend, ChatRequest(messages=QUESTION, max_tokens=2), hand))
        assert [i.text for i in items[:-1]] == ["one", " two"]
        assert items[-1].reason == "length"
        assert items[-1].usage["completion_tokens"] == 2

    def test_lists_at_least_one_model_with_its_context(self, backend):
        models = asyncio.run(backend.list_models())
        assert models and models[0]["id"] and models[0]["context_length"] > 0

    def test_closing_early_is_clean(self, backend):
        async def first_only():
            async with contextlib.aclosing(
                backend.stream_chat(ChatRequest(messages=QUESTION))
            ) as s:
                async for item in s:
                    return item

        assert asyncio.run(first_only()).text == "one"


def http_client(settings, *urls, busy_seconds=0.5):
    settings.INFERENCE_URLS = list(urls)
    settings.INFERENCE_BUSY_RETRY_SECONDS = busy_seconds
    settings.INFERENCE_FIRST_TOKEN_TIMEOUT = 1
    settings.INFERENCE_READ_TIMEOUT = 1
    return HttpInferenceClient()


def failure_of(client, hand: bool = False) -> InferenceError:
    with pytest.raises(InferenceError) as raised:
        asyncio.run(drain(client, ChatRequest(messages=QUESTION), hand))
    return raised.value


def test_the_http_client_hands_plain_text_chunks_to_on_delta(settings, fake_inference):
    settings.INFERENCE_URLS = [fake_inference.url]
    items = asyncio.run(drain(HttpInferenceClient(), ChatRequest(messages=QUESTION), True))
    assert items.handed and [i for i in items if isinstance(i, Delta)] == items.handed
    assert "".join(d.text for d in items.handed) == "one two three four five"


def test_unreachable_server_is_a_retryable_error_saying_so(settings):
    error = failure_of(http_client(settings, f"http://127.0.0.1:{free_port()}"))
    assert (error.kind, error.retryable) == ("unavailable", True)
    assert "cannot be reached" in error.message


def test_busy_server_is_retried_then_reported_busy(settings):
    with ScriptedServer(["503"] * 50) as server:
        error = failure_of(http_client(settings, server.url, busy_seconds=1))
    assert (error.kind, error.retryable) == ("busy", True)
    assert server.requests >= 2, "a busy server is retried with backoff"


def test_busy_server_that_frees_up_serves_the_reply(settings):
    with ScriptedServer(["503", "503", "ok"]) as server:
        items = asyncio.run(
            drain(http_client(settings, server.url, busy_seconds=5), ChatRequest(messages=QUESTION))
        )
    assert "".join(i.text for i in items if isinstance(i, Delta)) == "Hello there friend"


@pytest.mark.parametrize(
    "status,kind,retryable",
    [("401", "auth", False), ("404", "model", False), ("400", "refused", False)],
)
def test_client_errors_are_not_retryable(settings, status, kind, retryable):
    with ScriptedServer([status]) as server:
        error = failure_of(http_client(settings, server.url))
    assert (error.kind, error.retryable) == (kind, retryable)


def test_error_chunk_mid_stream_is_reported_with_its_message(settings, hand):
    with ScriptedServer(["error_chunk"]) as server:
        error = failure_of(http_client(settings, server.url), hand)
    assert error.kind == "upstream" and "CUDA fell over" in error.message


@pytest.mark.parametrize("behaviour", ["silent", "stall"])
def test_a_server_that_stops_sending_times_out_and_closes_the_connection(settings, behaviour, hand):
    with ScriptedServer([behaviour]) as server:
        error = failure_of(http_client(settings, server.url), hand)
        for _ in range(50):
            if server.open_streams == 0:
                break
            asyncio.run(asyncio.sleep(0.05))
    assert error.kind == "timeout" and error.retryable


def test_dropped_connection_mid_reply_is_reported(settings, hand):
    with ScriptedServer(["drop"]) as server:
        error = failure_of(http_client(settings, server.url), hand)
    assert error.kind == "dropped" and "lost" in error.message


def test_down_server_is_skipped_for_a_live_one_before_the_first_token(settings):
    with ScriptedServer(["ok"]) as live:
        client = http_client(settings, f"http://127.0.0.1:{free_port()}", live.url)
        items = asyncio.run(drain(client, ChatRequest(messages=QUESTION)))
    assert isinstance(items[-1], Finish)


def test_busy_server_is_skipped_for_a_free_one(settings):
    with ScriptedServer(["503"]) as busy, ScriptedServer(["ok"]) as free:
        client = http_client(settings, busy.url, free.url)
        items = asyncio.run(drain(client, ChatRequest(messages=QUESTION)))
    assert isinstance(items[-1], Finish) and free.requests == 1


def test_a_reply_that_breaks_after_its_first_token_is_not_retried_elsewhere(settings, hand):
    with ScriptedServer(["drop"]) as first, ScriptedServer(["ok"]) as second:
        client = http_client(settings, first.url, second.url)
        with pytest.raises(InferenceError):
            asyncio.run(drain(client, ChatRequest(messages=QUESTION), hand))
    assert second.requests == 0, "retrying after text was sent would duplicate it"
