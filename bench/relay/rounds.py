"""One measured round each: N replies side by side (through the site, or read directly from
the inference server), a burst of sends, idle streams, and a reconnect storm."""

import asyncio
import time

from bench.relay.clients import (
    direct_stream,
    new_conversation,
    read_reply,
    read_sse,
    record_token,
    send,
    site_stream,
)
from bench.relay.stats import ProcessStats, check, new_result, percentile


class PostPhase:
    """Notes the CPU time when the last of N sends has been answered: what the site spends
    after that is spent relaying tokens."""

    def __init__(self, streams: int, stats: ProcessStats | None):
        self.left, self.stats = streams, stats
        self.cpu = self.at = None

    def posted(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.at = time.monotonic()
            self.cpu = self.stats.cpu_seconds() if self.stats else None


async def run_round(kind, streams, texts, clients, stats, ramp: float, cold: bool = False):
    results = [new_result() for _ in texts]
    ready = asyncio.Event()
    phase = PostPhase(streams, stats)
    runner = site_stream if kind == "site" else direct_stream
    # Sends spread evenly over `ramp` seconds (0: all at once, the worst case).
    tasks = [
        asyncio.create_task(
            runner(
                clients[i % len(clients)],
                texts[i],
                results[i],
                ready,
                ramp * i / streams,
                cold=cold,
                on_posted=phase.posted,
            )
        )
        for i in range(streams)
    ]
    await asyncio.sleep(0.5 + (0 if cold else streams * 0.01))  # every stream open first
    cpu_before, wall_before = (stats.cpu_seconds() if stats else 0), time.monotonic()
    ready.set()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
    wall = time.monotonic() - wall_before
    row = {"path": kind, "streams": streams, **_latency(results, texts)}
    if stats:
        cpu = stats.cpu_seconds()
        row["cpu_pct"] = (cpu - cpu_before) / wall * 100
        row["rss_mb"], row["threads"] = stats.rss_mb_and_threads()
        if phase.cpu is not None:
            after = sum(1 for r in results for t in r["arrivals"] if t > phase.at)
            row["cpu_us_per_token"] = (cpu - phase.cpu) / after * 1e6 if after else None
    if phase.at is not None:
        # The tokens that arrived once every send was answered: the relaying alone.
        later = [
            latency * 1000
            for r in results
            for latency, arrived in zip(r["latency"], r["arrivals"])
            if arrived > phase.at
        ]
        row["p99_after_sends_ms"] = percentile(later, 99)
    return row


def _latency(results: list[dict], texts: list[str]) -> dict:
    latency = [x * 1000 for r in results for x in r["latency"]]
    first = [x * 1000 for r in results for x in r["first_token"]]
    return {
        "events": sum(len(r["seqs"]) for r in results),
        "sent": sum(len(t.split()) for t in texts),
        "received": sum(len("".join(r["text"]).split()) for r in results),
        "p50_ms": percentile(latency, 50),
        "p99_ms": percentile(latency, 99),
        "max_ms": max(latency) if latency else float("nan"),
        "first_token_p50_ms": percentile(first, 50),
        "errors": sum(len(r["errors"]) for r in results),
        **check(results, texts),
    }


async def send_burst(clients, count: int, stats: ProcessStats) -> dict:
    """CPU per send: `count` one-word messages at once on open conversations, including
    starting and ending each one-token reply's relay (the whole send path); and CPU per new
    conversation, of the `count` made at once before them (a new chat's first request)."""
    await asyncio.sleep(1)
    cpu = stats.cpu_seconds()
    conversations = await asyncio.gather(
        *(new_conversation(clients[i % len(clients)]) for i in range(count))
    )
    await asyncio.sleep(1)
    created = stats.cpu_seconds() - cpu
    cpu = stats.cpu_seconds()
    responses = await asyncio.gather(
        *(send(clients[i % len(clients)], c, "hi") for i, c in enumerate(conversations))
    )
    await asyncio.sleep(1.0)  # the one-token replies end
    spent = stats.cpu_seconds() - cpu
    accepted = sum(1 for r in responses if r.status_code == 202)
    return {
        "sends": count,
        "accepted": accepted,
        "cpu_ms_per_send": spent / count * 1000,
        "cpu_ms_per_conversation": created / count * 1000,
    }


async def idle_streams(clients, count: int, stats: ProcessStats) -> dict:
    rss0, threads0 = stats.rss_mb_and_threads()
    conversations = [(client, await new_conversation(client)) for client in clients]
    opened, contexts = 0, []
    try:
        for i in range(count):
            client, conversation = conversations[i % len(conversations)]
            context = client.stream("GET", f"/events/conversations/{conversation}/")
            response = await context.__aenter__()
            contexts.append(context)
            opened += response.status_code == 200
        await asyncio.sleep(2)
        rss1, threads1 = stats.rss_mb_and_threads()
    finally:
        for context in contexts:
            await context.__aexit__(None, None, None)
    return {
        "idle_streams": opened,
        "rss_mb": rss1,
        "threads": threads1,
        "rss_mb_before": rss0,
        "threads_before": threads0,
    }


async def reconnect_storm(clients, count: int, replying: int, tokens: int, window: float) -> dict:
    """`count` open event streams, `replying` of them with a reply being written, all dropped
    and reopened with their Last-Event-ID within `window` seconds (what a restart of the
    proxy does to every open page): each must resume, and each reply arrive exactly once."""
    pairs = [
        (clients[i % len(clients)], await new_conversation(clients[i % len(clients)]))
        for i in range(count)
    ]
    texts = [" ".join(f"r{i}w{j}" for j in range(tokens)) for i in range(replying)]
    results = [new_result() for _ in range(count)]
    first = await asyncio.gather(
        *(
            _first_leg(c, conv, results[i], texts[i] if i < replying else None)
            for i, (c, conv) in enumerate(pairs)
        )
    )
    resumed = await asyncio.gather(
        *(_second_leg(c, conv, results[i], window * i / count) for i, (c, conv) in enumerate(pairs))
    )
    errors = sum(len(r["errors"]) for r in results) + first.count(False)
    return {
        "streams": count,
        "resumed": sum(resumed),
        "errors": errors,
        **check(results[:replying], texts),
    }


async def _first_leg(client, conversation: str, result: dict, text: str | None) -> bool:
    """Open the stream, send (when replying), read a few tokens, then drop the connection."""
    sent = time.monotonic()
    async with client.stream("GET", f"/events/conversations/{conversation}/") as response:
        async for event, data, arrived, event_id in read_sse(response):
            result["last_id"] = event_id or result.get("last_id")
            if event == "stream-open":
                if text is None:
                    return True
                sent = time.monotonic()
                if (await send(client, conversation, text)).status_code != 202:
                    return False
            elif event == "token":
                result["sent"] = sent
                record_token(result, data, arrived, sent)
                if len(result["seqs"]) >= 3:
                    return True
    return False


async def _second_leg(client, conversation: str, result: dict, delay: float) -> bool:
    await asyncio.sleep(delay)
    headers = {"Last-Event-ID": result["last_id"]} if result.get("last_id") else {}
    async with client.stream(
        "GET", f"/events/conversations/{conversation}/", headers=headers
    ) as response:
        if response.status_code != 200:
            result["errors"].append(f"resume {response.status_code}")
            return False
        iterator = read_sse(response).__aiter__()
        event = "message"
        while event == "message":  # the opening padding comes first
            event = (await iterator.__anext__())[0]
        if event != "stream-open":
            result["errors"].append(f"resume began with {event}")
            return False
        if "sent" in result:
            await read_reply(iterator, result, result["sent"])
        return True
