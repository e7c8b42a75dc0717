"""Starts the fake inference server and the site processes, runs the rounds, prints."""

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench.relay import clients as stream_readers
from bench.relay.clients import new_http, sign_in
from bench.relay.database import ensure_database
from bench.relay.rounds import idle_streams, reconnect_storm, run_round, send_burst
from bench.relay.stats import ProcessStats
from tests.support.processes import InferenceServer, SiteServer

USERS = 10
COLUMNS = [
    "path",
    "streams",
    "sent",
    "received",
    "events",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "first_token_p50_ms",
    "lost",
    "duplicated",
    "out_of_order",
    "errors",
    "cpu_pct",
    "cpu_us_per_token",
    "rss_mb",
    "threads",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Relay latency and cost, side by side with "
        "reading the inference server directly."
    )
    parser.add_argument(
        "--streams", default="1,20,200", type=lambda s: [int(x) for x in s.split(",")]
    )
    parser.add_argument("--tokens", type=int, default=40, help="tokens per reply")
    parser.add_argument("--rate", type=float, default=20, help="tokens/s per stream")
    parser.add_argument(
        "--idle", type=int, default=1000, help="idle event streams to hold (0: skip)"
    )
    parser.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        help="spread the sends over this many seconds (0: all at once)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="open each conversation and event "
        "stream at its send time too, within --ramp (a burst of new pages)",
    )
    parser.add_argument(
        "--sends", type=int, default=200, help="burst of sends for CPU per send (0: skip)"
    )
    parser.add_argument(
        "--reconnect",
        type=int,
        default=0,
        metavar="N",
        help="N open streams (a tenth replying) reconnecting within 1 s",
    )
    parser.add_argument(
        "--sites", type=int, default=1, help="site processes (clients spread over them)"
    )
    parser.add_argument(
        "--client",
        choices=("httpx", "lean"),
        default="httpx",
        help="what reads the measured streams, through the site and directly alike: httpx, "
        "or bench/relay/lean.py (a fraction of httpx's CPU on the same machine)",
    )
    parser.add_argument("--database-url", default="", help="e.g. a PostgreSQL URL (default SQLite)")
    parser.add_argument("--redis-url", default="", help="Redis for the layer, log and delivery")
    return parser.parse_args(argv)


async def measure(args, sites: list[SiteServer], inference: InferenceServer) -> dict:
    stats = ProcessStats([site.process.popen.pid for site in sites])
    stamp = int(time.time())
    clients = [await sign_in(sites[i % len(sites)].url, f"bench{i}x{stamp}") for i in range(USERS)]
    direct = new_http(inference.url)
    out = {"rows": []}
    for streams in args.streams:
        texts = [" ".join(f"s{s}w{i}" for i in range(args.tokens)) for s in range(streams)]
        out["rows"].append(await run_round("direct", streams, texts, [direct], None, args.ramp))
        out["rows"].append(
            await run_round("site", streams, texts, clients, stats, args.ramp, cold=args.cold)
        )
    if args.sends:
        out["sends"] = await send_burst(clients, args.sends, stats)
    if args.reconnect:
        out["reconnect"] = await reconnect_storm(
            clients,
            args.reconnect,
            replying=max(1, args.reconnect // 10),
            tokens=args.tokens,
            window=1.0,
        )
    if args.idle:
        out["idle"] = await idle_streams(clients, args.idle, stats)
    for client in [*clients, direct]:
        await client.aclose()
    return out


def report(args, out: dict) -> None:
    print(
        f"fake engine at {args.rate:g} tokens/s per stream, {args.tokens} tokens per reply, "
        f"{USERS} signed-in users, sends spread over {args.ramp:g} s"
        f"{' (cold pages)' if args.cold else ''}, {args.sites} site process(es), "
        f"{'PostgreSQL' if args.database_url else 'SQLite'}"
        f"{' + Redis' if args.redis_url else ' + in-memory'}, {os.cpu_count()} cores, "
        f"streams read by {args.client}; "
        "latency = client arrival - inference production"
    )
    print(" | ".join(f"{c:>10}" for c in COLUMNS))
    for row in out["rows"]:
        print(" | ".join(_cell(row.get(c)) for c in COLUMNS))
    rows = out["rows"]
    for direct, site in zip(rows[::2], rows[1::2]):
        print(
            f"site over direct at {site['streams']:>4} streams: p50 "
            f"{site['p50_ms'] - direct['p50_ms']:+.1f} ms, p99 {site['p99_ms'] - direct['p99_ms']:+.1f} ms"
            f", CPU per relayed token {_cell(site.get('cpu_us_per_token')).strip()} us"
            f"; p99 of the tokens after the last send was answered: site "
            f"{site.get('p99_after_sends_ms', float('nan')):.1f} ms, direct "
            f"{direct.get('p99_after_sends_ms', float('nan')):.1f} ms"
        )
    if "sends" in out:
        s = out["sends"]
        print(
            f"send burst: {s['accepted']}/{s['sends']} accepted, CPU per send "
            f"{s['cpu_ms_per_send']:.2f} ms (request + its one-token reply's relay); CPU per "
            f"new conversation {s['cpu_ms_per_conversation']:.2f} ms (the {s['sends']} made "
            "at once before them)"
        )
    if "reconnect" in out:
        r = out["reconnect"]
        print(
            f"reconnect storm: {r['resumed']}/{r['streams']} streams resumed within 1 s; "
            f"lost {r['lost']}, duplicated {r['duplicated']}, out of order {r['out_of_order']}, "
            f"errors {r['errors']}"
        )
    if "idle" in out:
        i = out["idle"]
        print(
            f"idle event streams: {i['idle_streams']} open, site RSS {i['rss_mb_before']:.0f} -> "
            f"{i['rss_mb']:.0f} MB, threads {i['threads_before']} -> {i['threads']}"
        )


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:>10.1f}"
    return f"{str(value if value is not None else '-'):>10}"


def run(args) -> dict:
    """Start the fake inference server and the site processes, measure, stop them (also
    when one of them fails to start)."""
    stream_readers.LEAN = args.client == "lean"
    if args.database_url and ensure_database(args.database_url):
        print(f"created the benchmark's database ({args.database_url})")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        inference = InferenceServer(
            tmp, engine="fake", FAKE_TOKENS_PER_SECOND=args.rate, MAX_BATCH=5000, MAX_QUEUE=5000
        ).start()
        sites: list[SiteServer] = []
        try:
            _start_sites(args, tmp, inference, sites)
            return asyncio.run(measure(args, sites, inference))
        finally:
            for site in sites:
                site.stop()
            inference.stop()


def site_env(inference_url: str) -> dict:
    """A benchmarked site's settings: its inference server, token timestamps, and no
    per-user limits in the way of hundreds of streams from one benchmark user."""
    return dict(
        INFERENCE_URLS=inference_url,
        RELAY_EVENT_TIMESTAMPS=1,
        LOG_LEVEL="WARNING",
        CHAT_MAX_STREAMING_PER_USER=100000,
        CHAT_MESSAGES_PER_MINUTE=1000000,
        DJANGO_SECRET_KEY=uuid.uuid4().hex * 2,
    )


def _start_sites(args, tmp: Path, inference: InferenceServer, sites: list[SiteServer]) -> None:
    """Starts args.sites site processes into `sites` (the caller stops them)."""
    env = site_env(inference.url)
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    for index in range(args.sites):
        site = SiteServer(tmp, tmp / "var", **env)
        sites.append(site)
        site.start(migrate=index == 0)
    for site in sites:
        httpx.get(f"{site.url}/accounts/login/", timeout=30)


def main() -> None:
    args = parse_args()
    report(args, run(args))
