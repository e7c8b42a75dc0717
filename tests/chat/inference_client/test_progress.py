"""The prompt's progress over HTTP: the client asks for it (`return_progress`) and reads
`prompt_progress` chunks as Progress items, against `python -m inference` with the fake
engine prefilling at a known pace."""

import asyncio

import pytest

from chat.inference_client import ChatRequest, Delta, Finish, InferenceError, Progress
from chat.inference_client.http import HttpInferenceClient, _progress, request_body
from tests.chat.inference_client.test_clients import QUESTION, drain
from tests.support.processes import slow_reader
from tests.support.scripted_server import ScriptedServer

PASTE = [{"role": "user", "content": " ".join(f"w{i}" for i in range(300))}]


@pytest.fixture(scope="module")
def slow_prefill(tmp_path_factory):
    """300 prompt words take ~3 s to prefill, in steps of 64 (~0.6 s each)."""
    with slow_reader(tmp_path_factory.mktemp("slow-prefill"), words_per_second=100) as server:
        yield server


@pytest.fixture
def client(settings, slow_prefill):
    settings.INFERENCE_URLS = [slow_prefill.url]
    settings.INFERENCE_FIRST_TOKEN_TIMEOUT = 1.5
    # shorter than a prefill step (~0.6 s): a silence between two pieces of text, not before
    # the first (each report gives the first-token wait again)
    settings.INFERENCE_READ_TIMEOUT = 0.3
    return HttpInferenceClient()


def test_a_long_prompt_reports_its_progress_before_the_first_token(client):
    items = asyncio.run(drain(client, ChatRequest(messages=PASTE, max_tokens=2)))
    first = next(i for i, item in enumerate(items) if isinstance(item, Delta))
    progress = items[:first]
    assert progress and all(isinstance(p, Progress) for p in progress)
    assert [p.processed for p in progress] == [64, 128, 192, 256]
    assert {(p.total, p.cached) for p in progress} == {(300, 0)}
    assert not any(isinstance(i, Progress) for i in items[first:])
    assert isinstance(items[-1], Finish) and items[-1].reason == "length"


def test_progress_keeps_a_slow_prompt_alive_past_the_first_token_timeout(client):
    # ~3 s to the first token against a 1.5 s timeout: each step's progress shows the server
    # is at work, where silence would be a hung server; and its ~0.6 s steps are longer than
    # the 0.3 s read timeout, which a report does not bring forward
    items = asyncio.run(drain(client, ChatRequest(messages=PASTE, max_tokens=1)))
    assert [i.text for i in items if isinstance(i, Delta)] == ["w0"]


def test_without_progress_the_same_prompt_times_out_and_nothing_is_asked(client, settings):
    settings.INFERENCE_PROMPT_PROGRESS = False
    assert "return_progress" not in request_body(ChatRequest(messages=PASTE))
    with pytest.raises(InferenceError) as raised:
        asyncio.run(drain(client, ChatRequest(messages=PASTE, max_tokens=1)))
    assert raised.value.kind == "timeout"


@pytest.mark.parametrize(
    "figures",
    [
        None,
        "half",
        {"processed": 1, "total": 0, "cache": 0},
        {"processed": "1", "total": 2},
        {"processed": -1, "total": 2, "cache": 0},
        {"processed": True, "total": 2, "cache": 0},
    ],
)
def test_a_progress_chunk_that_makes_no_sense_is_ignored(figures):
    assert _progress({"prompt_progress": figures}) is None


def test_progress_past_the_total_is_read_as_the_total():
    chunk = {"prompt_progress": {"processed": 9, "total": 5, "cache": 7}}
    assert _progress(chunk) == Progress(processed=5, total=5, cached=5)


def test_a_server_that_refuses_the_progress_field_is_asked_again_without_it(settings):
    settings.INFERENCE_BUSY_RETRY_SECONDS = 0
    with ScriptedServer(["strict"] * 3) as server:
        settings.INFERENCE_URLS = [server.url]
        client = HttpInferenceClient()
        for _ in range(2):
            items = asyncio.run(drain(client, ChatRequest(messages=QUESTION)))
            assert "".join(i.text for i in items if isinstance(i, Delta)) == "Hello there friend"
    # refused once, then left out for this server: the second reply took one request
    assert ["return_progress" in body for body in server.bodies] == [True, False, False]


def test_another_refusal_is_still_the_users_error(settings):
    settings.INFERENCE_BUSY_RETRY_SECONDS = 0
    with ScriptedServer(["400"]) as server:
        settings.INFERENCE_URLS = [server.url]
        with pytest.raises(InferenceError) as raised:
            asyncio.run(drain(HttpInferenceClient(), ChatRequest(messages=QUESTION)))
    assert raised.value.kind == "refused" and server.requests == 1
