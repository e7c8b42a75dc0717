"""Relay benchmark: how much the site adds between the model and the user's eyes.

Starts `python -m inference` (ENGINE=fake, a known pace, each chunk stamped with the
server's monotonic clock) and the site under daphne, then for each N runs N streams through
the site (sign in, POST a message, read the conversation's SSE stream) and N streams read
directly from the inference server, side by side in one run. Latency = arrival at the client
- production at the inference server (same machine, same monotonic clock).

    .venv/bin/python -m bench.relay --streams 1,20,200 --tokens 40 --rate 20
"""

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.processes import InferenceServer, SiteServer

USERS = 10


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class ProcessStats:
    """CPU seconds, RSS and threads of a process, from /proc."""

    def __init__(self, pid: int):
        self.pid = pid
        self.ticks = os.sysconf("SC_CLK_TCK")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.ticks

    def rss_mb_and_threads(self) -> tuple[float, int]:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{self.pid}/status").read_text().splitlines()
        )
        return int(status["VmRSS"].split()[0]) / 1024, int(status["Threads"])


async def read_sse(response: httpx.Response):
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            event, data = "message", []
            for line in block.split("\n"):
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
            yield event, "\n".join(data), time.monotonic()


async def sign_in(base: str, name: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(60, read=120),
                               limits=httpx.Limits(max_connections=None))
    await client.get("/accounts/signup/")
    password = "bench-Pass-phrase-9"
    response = await client.post("/accounts/signup/", data={
        "username": name, "password1": password, "password2": password,
        "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    assert response.status_code == 302, response.text[:500]
    return client


def api_headers(client: httpx.AsyncClient) -> dict:
    return {"X-CSRFToken": client.cookies["csrftoken"], "Content-Type": "application/json"}


async def site_stream(client: httpx.AsyncClient, text: str, result: dict, ready: asyncio.Event,
                      delay: float = 0.0):
    response = await client.post("/api/conversations/", content="{}", headers=api_headers(client))
    conversation = response.json()["id"]
    async with client.stream("GET", f"/events/conversations/{conversation}/") as events:
        iterator = read_sse(events).__aiter__()
        while (await iterator.__anext__())[0] != "stream-open":
            pass
        await ready.wait()
        await asyncio.sleep(delay)
        sent = time.monotonic()
        response = await client.post(f"/api/conversations/{conversation}/messages/",
                                     content=json.dumps({"content": text}),
                                     headers=api_headers(client))
        if response.status_code != 202:
            result["errors"].append(f"POST {response.status_code}: {response.text[:100]}")
            return
        async for event, data, arrived in iterator:
            if event == "token":
                token = json.loads(data)
                if not result["seqs"]:
                    result["first_token"].append(arrived - sent)
                result["seqs"].append(token["seq"])
                result["text"].append(token["text"])
                if "produced_at" in token:
                    result["latency"].append(arrived - token["produced_at"])
            elif event == "message.end":
                result["end"] = json.loads(data)
                return
            elif event == "message.error":
                result["errors"].append(json.loads(data)["error"])
                return
            elif event == "stream-reset":
                result["errors"].append("stream-reset")


async def direct_stream(client: httpx.AsyncClient, text: str, result: dict, ready: asyncio.Event,
                        delay: float = 0.0):
    await ready.wait()
    await asyncio.sleep(delay)
    sent = time.monotonic()
    body = {"messages": [{"role": "user", "content": text}], "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            arrived = time.monotonic()
            chunk = json.loads(line[5:])
            content = (chunk["choices"] or [{}])[0].get("delta", {}).get("content")
            if content:
                if not result["text"]:
                    result["first_token"].append(arrived - sent)
                result["seqs"].append(len(result["seqs"]))
                result["text"].append(content)
                result["latency"].append(arrived - chunk["x_ts"])


def new_result() -> dict:
    return {"seqs": [], "text": [], "latency": [], "first_token": [], "errors": []}


def check(results: list[dict], texts: list[str]) -> dict:
    lost = duplicated = disordered = 0
    for result, text in zip(results, texts):
        seqs = result["seqs"]
        duplicated += len(seqs) - len(set(seqs))
        disordered += sum(1 for a, b in zip(seqs, seqs[1:]) if b < a)
        got = "".join(result["text"])
        if got != text:
            lost += max(1, len(text.split()) - len(got.split()))
    return {"lost": lost, "duplicated": duplicated, "out_of_order": disordered}


async def run_round(kind, streams, texts, clients, stats: ProcessStats | None, ramp: float):
    results = [new_result() for _ in texts]
    ready = asyncio.Event()
    runner = site_stream if kind == "site" else direct_stream
    # Sends spread evenly over `ramp` seconds (0: all at once, the worst case).
    tasks = [asyncio.create_task(runner(clients[i % len(clients)], texts[i], results[i], ready,
                                        ramp * i / streams))
             for i in range(streams)]
    await asyncio.sleep(0.5 + streams * 0.01)  # let every stream open before the clock starts
    cpu_before, wall_before = (stats.cpu_seconds() if stats else 0), time.monotonic()
    ready.set()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
    wall = time.monotonic() - wall_before
    cpu = ((stats.cpu_seconds() - cpu_before) / wall * 100) if stats else None
    rss, threads = stats.rss_mb_and_threads() if stats else (None, None)
    latency = [x * 1000 for r in results for x in r["latency"]]
    first = [x * 1000 for r in results for x in r["first_token"]]
    row = {"path": kind, "streams": streams, "events": sum(len(r["seqs"]) for r in results),
           "sent": sum(len(t.split()) for t in texts),
           "received": sum(len("".join(r["text"]).split()) for r in results),
           "p50_ms": percentile(latency, 50), "p99_ms": percentile(latency, 99),
           "max_ms": max(latency) if latency else float("nan"),
           "first_token_p50_ms": percentile(first, 50),
           "errors": sum(len(r["errors"]) for r in results),
           "cpu_pct": cpu, "rss_mb": rss, "threads": threads}
    row.update(check(results, texts))
    return row


async def idle_streams(site_url: str, clients, count: int, stats: ProcessStats) -> dict:
    rss0, threads0 = stats.rss_mb_and_threads()
    conversation_ids = []
    for client in clients:
        response = await client.post("/api/conversations/", content="{}", headers=api_headers(client))
        conversation_ids.append((client, response.json()["id"]))
    opened, contexts = 0, []
    try:
        for i in range(count):
            client, conversation = conversation_ids[i % len(conversation_ids)]
            context = client.stream("GET", f"/events/conversations/{conversation}/")
            response = await context.__aenter__()
            contexts.append(context)
            if response.status_code == 200:
                opened += 1
        await asyncio.sleep(2)
        rss1, threads1 = stats.rss_mb_and_threads()
    finally:
        for context in contexts:
            await context.__aexit__(None, None, None)
    return {"idle_streams": opened, "rss_mb": rss1, "threads": threads1,
            "rss_mb_before": rss0, "threads_before": threads0}


def print_rows(rows: list[dict]) -> None:
    columns = ["path", "streams", "sent", "received", "events", "p50_ms", "p99_ms", "max_ms", "first_token_p50_ms",
               "lost", "duplicated", "out_of_order", "errors", "cpu_pct", "rss_mb", "threads"]
    print(" | ".join(f"{c:>10}" for c in columns))
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c)
            cells.append(f"{v:>10.1f}" if isinstance(v, float) else f"{str(v if v is not None else '-'):>10}")
        print(" | ".join(cells))


async def measure(args, site: SiteServer, inference: InferenceServer) -> tuple[list, dict | None]:
    stats = ProcessStats(site.process.popen.pid)
    clients = [await sign_in(site.url, f"bench{i}{int(time.time())}") for i in range(USERS)]
    direct = httpx.AsyncClient(base_url=inference.url, timeout=httpx.Timeout(60, read=120),
                               limits=httpx.Limits(max_connections=None))
    rows = []
    for streams in args.streams:
        texts = [" ".join(f"s{s}w{i}" for i in range(args.tokens)) for s in range(streams)]
        rows.append(await run_round("direct", streams, texts, [direct], None, args.ramp))
        rows.append(await run_round("site", streams, texts, clients, stats, args.ramp))
        extra = {k: rows[-1][k] - rows[-2][k] for k in ("p50_ms", "p99_ms")}
        rows[-1]["over_direct"] = extra
    idle = await idle_streams(site.url, clients, args.idle, stats) if args.idle else None
    for client in clients:
        await client.aclose()
    await direct.aclose()
    return rows, idle


def report(args, rows: list, idle: dict | None) -> None:
    print(f"fake engine at {args.rate:g} tokens/s per stream, {args.tokens} tokens per reply, "
          f"{USERS} signed-in users, sends spread over {args.ramp:g} s, {os.cpu_count()} cores; "
          f"latency = client arrival - inference production")
    print_rows(rows)
    for row in rows:
        if "over_direct" in row:
            d = row["over_direct"]
            print(f"site over direct at {row['streams']:>4} streams: "
                  f"p50 {d['p50_ms']:+.1f} ms, p99 {d['p99_ms']:+.1f} ms")
    if idle:
        print(f"idle event streams: {idle['idle_streams']} open, site RSS "
              f"{idle['rss_mb_before']:.0f} -> {idle['rss_mb']:.0f} MB, threads "
              f"{idle['threads_before']} -> {idle['threads']}")


def run(args) -> tuple[list, dict | None]:
    """Start the fake inference server and the site, measure, stop them."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        inference = InferenceServer(tmp, engine="fake", FAKE_TOKENS_PER_SECOND=args.rate,
                                    MAX_BATCH=1000, MAX_QUEUE=1000).start()
        site = SiteServer(tmp, tmp / "var", INFERENCE_URLS=inference.url, RELAY_EVENT_TIMESTAMPS=1,
                          CHAT_MAX_STREAMING_PER_USER=1000, CHAT_MESSAGES_PER_MINUTE=100000,
                          LOG_LEVEL="WARNING").start()
        try:
            return asyncio.run(measure(args, site, inference))
        finally:
            site.stop()
            inference.stop()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="1,20,200", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--tokens", type=int, default=40, help="tokens per reply")
    parser.add_argument("--rate", type=float, default=20, help="tokens/s per stream")
    parser.add_argument("--idle", type=int, default=1000, help="idle event streams to hold (0: skip)")
    parser.add_argument("--ramp", type=float, default=0.0,
                        help="spread the sends over this many seconds (0: all at once)")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    rows, idle = run(args)
    report(args, rows, idle)


if __name__ == "__main__":
    main()
