"""The benchmark's clients: signed-in users that behave like the page (create a conversation,
open its event stream, send, read tokens), and clients of the inference server directly."""

import asyncio
import contextlib
import json
import time

import httpx

from bench.relay import lean

PASSWORD = "bench-Pass-phrase-9"
# --client lean: the measured streams are read by bench/relay/lean.py instead of httpx
LEAN = False


@contextlib.asynccontextmanager
async def event_stream(client: httpx.AsyncClient, path: str):
    """An iterator of (event, data, arrival time, id) of the event stream at `path`."""
    if LEAN:
        async with lean.stream(client, "GET", path) as events:
            yield events
    else:
        async with client.stream("GET", path) as response:
            yield read_sse(response)


async def read_sse(response: httpx.Response):
    """(event, data, arrival time, id) for each event of an SSE response."""
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            event, data, event_id = lean.parse_block(block)
            yield event, data, time.monotonic(), event_id


def new_http(base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base,
        timeout=httpx.Timeout(60, read=120),
        limits=httpx.Limits(max_connections=None),
    )


async def sign_in(base: str, name: str) -> httpx.AsyncClient:
    client = new_http(base)
    await client.get("/accounts/signup/")
    response = await client.post(
        "/accounts/signup/",
        data={
            "username": name,
            "password1": PASSWORD,
            "password2": PASSWORD,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    assert response.status_code == 302, response.text[:500]
    return client


def api_headers(client: httpx.AsyncClient) -> dict:
    return {"X-CSRFToken": client.cookies["csrftoken"], "Content-Type": "application/json"}


async def new_conversation(client: httpx.AsyncClient) -> str:
    response = await client.post("/api/conversations/", content="{}", headers=api_headers(client))
    response.raise_for_status()
    return response.json()["id"]


async def send(client: httpx.AsyncClient, conversation: str, text: str) -> httpx.Response:
    return await client.post(
        f"/api/conversations/{conversation}/messages/",
        content=json.dumps({"content": text}),
        headers=api_headers(client),
    )


def record_token(result: dict, data: str, arrived: float, sent: float) -> None:
    token = json.loads(data)
    if not result["seqs"]:
        result["first_token"].append(arrived - sent)
    result["seqs"].append(token["seq"])
    result["text"].append(token["text"])
    result["arrivals"].append(arrived)
    if "produced_at" in token:
        result["latency"].append(arrived - token["produced_at"])


async def read_reply(iterator, result: dict, sent: float) -> None:
    async for event, data, arrived, event_id in iterator:
        result["last_id"] = event_id or result.get("last_id")
        if event == "token":
            record_token(result, data, arrived, sent)
        elif event == "message.end":
            return
        elif event == "message.error":
            result["errors"].append(json.loads(data)["error"])
            return
        elif event == "stream-reset":
            result["errors"].append("stream-reset")


async def site_stream(
    client,
    text: str,
    result: dict,
    ready: asyncio.Event,
    delay: float = 0.0,
    cold: bool = False,
    on_posted=None,
):
    """One user's reply through the site. cold: the conversation and its event stream are
    opened only at the send time too (a page loaded and used at once), not beforehand."""
    if not cold:
        conversation = await new_conversation(client)
    else:
        await ready.wait()
        await asyncio.sleep(delay)
    try:
        if cold:
            conversation = await new_conversation(client)
        async with event_stream(client, f"/events/conversations/{conversation}/") as events:
            iterator = events.__aiter__()
            while (await iterator.__anext__())[0] != "stream-open":
                pass
            if not cold:
                await ready.wait()
                await asyncio.sleep(delay)
            sent = time.monotonic()
            response = await send(client, conversation, text)
            if on_posted:
                on_posted()
            if response.status_code != 202:
                result["errors"].append(f"POST {response.status_code}: {response.text[:100]}")
                return
            await read_reply(iterator, result, sent)
    except httpx.HTTPError as exc:
        result["errors"].append(f"{type(exc).__name__}: {exc}")


async def direct_stream(
    client,
    text: str,
    result: dict,
    ready: asyncio.Event,
    delay: float = 0.0,
    cold: bool = False,
    on_posted=None,
):
    await ready.wait()
    await asyncio.sleep(delay)
    sent = time.monotonic()
    body = {"messages": [{"role": "user", "content": text}], "stream": True}
    async with _completion_chunks(client, body) as chunks:
        if on_posted:
            on_posted()
        async for data, arrived in chunks:
            chunk = json.loads(data)
            content = (chunk["choices"] or [{}])[0].get("delta", {}).get("content")
            if content:
                if not result["text"]:
                    result["first_token"].append(arrived - sent)
                result["seqs"].append(len(result["seqs"]))
                result["text"].append(content)
                result["arrivals"].append(arrived)
                result["latency"].append(arrived - chunk["x_ts"])


@contextlib.asynccontextmanager
async def _completion_chunks(client: httpx.AsyncClient, body: dict):
    """The `data:` payloads of a streamed chat completion but [DONE], with their arrival."""

    async def lean_chunks(events):
        async for _, data, arrived, _ in events:
            if data != "[DONE]":
                yield data, arrived

    async def httpx_chunks(response):
        async for line in response.aiter_lines():
            if line.startswith("data:") and not line.endswith("[DONE]"):
                yield line[5:], time.monotonic()

    if LEAN:
        payload = json.dumps(body).encode()
        async with lean.stream(client, "POST", "/v1/chat/completions", payload) as events:
            yield lean_chunks(events)
    else:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            yield httpx_chunks(response)
