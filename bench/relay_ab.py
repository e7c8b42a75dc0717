"""A/B of the site's CPU: two site processes, one running an earlier commit (`git archive`)
and one this working tree, behind one fake inference server, with rounds alternating
between them (ABBA…), so that the machine's drift lands on both alike.

Each round is `bench.relay`'s: N streams × T tokens through one site (CPU per relayed
token), and optionally a burst of one-word sends (CPU per send). The figure to read is the
median over pairs of after/before; the same commit against itself shows the noise.

    .venv/bin/python -m bench.relay_ab --before HEAD~1 --streams 200 --tokens 100 --pairs 3

With `--database-url` each side gets a database of its own (`<url>_ab_before`,
`<url>_ab_after`, created if missing); with `--redis-url A,B` each side its own Redis (two
servers: pub/sub ignores the database number, so one server would deliver each side's
events to the other's process too).
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.measure import unpack_commit
from bench.relay.clients import sign_in
from bench.relay.rounds import run_round, send_burst
from bench.relay.runner import site_env
from bench.relay.stats import ProcessStats
from tests.support import processes
from tests.support.processes import InferenceServer, SiteServer


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="HEAD", help="commit for side A (git archive)")
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20)
    parser.add_argument("--sends", type=int, default=0, help="burst of sends per round (0: none)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--database-url", default="", help="PostgreSQL server URL, no database")
    parser.add_argument("--redis-url", default="", help="two URLs, comma-separated: A,B")
    return parser.parse_args(argv)


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _database(base: str, name: str) -> str:
    import psycopg

    with psycopg.connect(f"{base}/postgres", autocommit=True) as connection:
        exists = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone()
        if not exists:
            connection.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


def _start_site(root: Path, tmp: Path, name: str, env: dict) -> SiteServer:
    """A SiteServer whose processes run from `root` (processes.ROOT is read at start)."""
    saved = processes.ROOT
    processes.ROOT = root
    try:
        site = SiteServer(tmp, tmp / f"var-{name}", **env).start()
    finally:
        processes.ROOT = saved
    httpx.get(f"{site.url}/accounts/login/", timeout=30)
    return site


async def _side(site: SiteServer, name: str) -> dict:
    stamp = int(time.time())
    clients = [await sign_in(site.url, f"ab{name}{i}x{stamp}") for i in range(10)]
    return {"name": name, "clients": clients, "stats": ProcessStats([site.process.popen.pid])}


async def _round(args, side: dict) -> dict:
    texts = [" ".join(f"s{s}w{i}" for i in range(args.tokens)) for s in range(args.streams)]
    load = _loadavg()
    row = await run_round("site", args.streams, texts, side["clients"], side["stats"], 0.0)
    out = {
        "side": side["name"],
        "us_per_token": row.get("cpu_us_per_token"),
        "p99_ms": row["p99_ms"],
        "ok": row["lost"] == row["duplicated"] == row["out_of_order"] == row["errors"] == 0,
    }
    if args.sends:
        burst = await send_burst(side["clients"], args.sends, side["stats"])
        out["ms_per_send"] = burst["cpu_ms_per_send"]
        out["ms_per_conversation"] = burst["cpu_ms_per_conversation"]
    out["load"] = f"{load} -> {_loadavg()}"
    return out


async def _measure(args, sites: dict) -> list[tuple[dict, dict]]:
    a, b = await _side(sites["before"], "before"), await _side(sites["after"], "after")
    pairs = []
    for index in range(args.pairs):
        first, second = (a, b) if index % 2 == 0 else (b, a)
        one, two = await _round(args, first), await _round(args, second)
        for row in (one, two):
            print(row, flush=True)
        pairs.append((one, two) if first is a else (two, one))
    for side in (a, b):
        for client in side["clients"]:
            await client.aclose()
    return pairs


def _report(pairs) -> None:
    for key in ("us_per_token", "ms_per_send", "ms_per_conversation", "p99_ms"):
        ratios = [
            after[key] / before[key]
            for before, after in pairs
            if before.get(key) and after.get(key) is not None
        ]
        if ratios:
            print(
                f"{key}: before {[round(b[key], 1) for b, _ in pairs]}, "
                f"after {[round(a[key], 1) for _, a in pairs]}; after/before "
                f"{[round(r, 3) for r in ratios]}, median {statistics.median(ratios):.3f}"
            )
    print("every round exact:", all(r["ok"] for pair in pairs for r in pair))


def main() -> None:
    args = parse_args()
    redis_urls = args.redis_url.split(",") if args.redis_url else []
    print(f"load average at start: {_loadavg()}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        before_root = unpack_commit(args.before, tmp / "before")
        inference = InferenceServer(
            tmp, engine="fake", FAKE_TOKENS_PER_SECOND=args.rate, MAX_BATCH=5000, MAX_QUEUE=5000
        ).start()
        sites = {}
        try:
            for index, (name, root) in enumerate(
                (("before", before_root), ("after", processes.ROOT))
            ):
                env = site_env(inference.url)
                if args.database_url:
                    env["DATABASE_URL"] = _database(args.database_url, f"ab_{name}")
                if redis_urls:
                    env["REDIS_URL"] = redis_urls[index]
                sites[name] = _start_site(root, tmp, name, env)
            _report(asyncio.run(_measure(args, sites)))
        finally:
            for site in sites.values():
                site.stop()
            inference.stop()
    print(f"load average at end: {_loadavg()}")


if __name__ == "__main__":
    main()
