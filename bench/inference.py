"""Benchmark of the inference server: continuous batching vs the seed's thread-per-request
`model.generate` + TextIteratorStreamer pattern, measured side by side in one run.

    .venv/bin/python -m bench.inference                 # N = 1,4,8,16, 128 tokens
    .venv/bin/python -m bench.inference --n 1,8 --hf-manager --llama-python /path/to/python
    .venv/bin/python -m bench.inference --n 1,8 --before HEAD~1 --sampling temperature=0.5

Our server (`python -m inference`), the seed's pattern (`bench.seed_server`) and
llama-cpp-python's server (optional) each run in their own process, as deployed, on the same
model file and DTYPE; the clients are httpx streams in this process, where the in-process
rows (our engine, transformers' manager) also run. Rows: aggregate tokens/s, TTFT p50/p99,
inter-token latency p50/p99 (between received content chunks), failures (streams that ended
early or with an error). Then one stream over HTTP vs the same engine in-process vs llama.cpp
in interleaved rounds, the issue's targets as ratios of those rows, and one row per DTYPE;
with --before, an earlier commit's server beside ours, mode by mode.
bench/README.md keeps the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from bench.measure import (
    HEADER,
    PROMPTS,
    Result,
    commit_tree,
    percentile,
    sampling_fields,
    wait_for_quiet,
)
from inference.engine import Message
from inference.hf_engine import TransformersEngine
from inference.model_store import LoadedModel, prepare_model
from inference.sampling_params import SamplingParams
from inference.scheduler import TokenEvent
from inference.settings import Settings

Measure = Callable[[int, int], Result]  # (concurrent streams, tokens each) -> what it measured


# --- clients --------------------------------------------------------------------------------
async def one_http(
    client: httpx.AsyncClient, url: str, i: int, tokens: int, res: Result, sampling: dict[str, Any]
) -> None:
    body = {
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "stream": True,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    } | sampling
    start = time.monotonic()
    last: float | None = None
    done = False
    got = 0
    chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    break
                if chunk.get("usage"):
                    got = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    chunks += 1
                    now = time.monotonic()
                    if last is None:
                        res.ttft.append(now - start)
                    else:
                        res.itl.append(now - last)
                    last = now
    except httpx.HTTPError:
        pass
    got = got or chunks  # servers that send no usage chunk: one token per chunk
    if not done or got < tokens:
        res.failures += 1
    res.tokens += got


async def run_http(url: str, n: int, tokens: int, sampling: dict[str, Any]) -> Result:
    res = Result()
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.monotonic()
        await asyncio.gather(*(one_http(client, url, i, tokens, res, sampling) for i in range(n)))
        res.wall = time.monotonic() - start
    return res


async def run_in_process(engine: TransformersEngine, n: int, tokens: int) -> Result:
    res = Result()

    async def one(i: int) -> None:
        start, last = time.monotonic(), None
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        async for ev in engine.submit([Message("user", PROMPTS[i % len(PROMPTS)])], params):
            if isinstance(ev, TokenEvent):
                now = time.monotonic()
                (res.ttft if last is None else res.itl).append(
                    now - (start if last is None else last)
                )
                last = now
            elif getattr(ev, "completion_tokens", 0) >= tokens:
                res.tokens += ev.completion_tokens
            else:
                res.failures += 1

    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    res.wall = time.monotonic() - start
    return res


def settings_for(dtype: str, max_batch: int) -> Settings:
    return Settings(
        engine="transformers",
        dtype=dtype,
        device="auto",
        max_batch=max_batch,
        max_queue=256,
        model="",
        model_name="",
        inference_api_key="",
        context_length=0,
    )


async def in_process(loaded: LoadedModel, settings: Settings, n: int, tokens: int) -> Result:
    engine = TransformersEngine(settings, loaded=loaded)
    await engine.start()
    await engine.wait_ready(600)
    try:
        return await run_in_process(engine, n, tokens)
    finally:
        await engine.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", default="1,4,8,16", help="concurrency levels")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the interleaved single-stream comparison (medians reported; 0: skip)",
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="DTYPE of the side-by-side comparison (auto: "
        "what the server picks, int4 for the bundled model on CPU)",
    )
    ap.add_argument(
        "--dtypes",
        default="float32,bfloat16,int8,int4",
        help="per-DTYPE rows (in-process; empty: skip)",
    )
    ap.add_argument("--dtype-n", type=int, default=8, help="concurrency of the per-DTYPE rows")
    ap.add_argument("--skip-seed", action="store_true", help="skip the seed baseline (slow)")
    ap.add_argument(
        "--sampling",
        action="append",
        default=[],
        type=sampling_fields,
        metavar="K=V,...",
        help="also run our server with these request fields (each request stays "
        "max_tokens long: ignore_eos), e.g. temperature=0.5,top_p=0.9,"
        "repetition_penalty=1.1: a mode of its own, 'sampling A', B...; repeatable",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every level's modes this many times, interleaved; rows are medians",
    )
    ap.add_argument(
        "--plain",
        action="store_true",
        help="also run our server with PREFIX_CACHE_MB=0 and PREFILL_CHUNK_TOKENS=0, "
        "interleaved with the default one: what the cache and chunking cost concurrent streams",
    )
    ap.add_argument(
        "--before",
        default="",
        metavar="REV",
        help="also run an earlier commit's server (git archive), and each --sampling mode "
        "through it, interleaved with this tree's: what a change did, side by side",
    )
    ap.add_argument(
        "--hf-manager",
        action="store_true",
        help="add transformers' ContinuousBatchingManager, in-process, as a baseline",
    )
    ap.add_argument(
        "--llama-python",
        default="",
        help="a python with llama-cpp-python[server] installed: adds its server, "
        "on the same GGUF file, as a baseline",
    )
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    levels = [int(x) for x in args.n.split(",")]
    loaded = prepare_model(settings_for(args.dtype, 1))
    print(f"\nmodel {loaded.folder} dtype {loaded.dtype}, {args.tokens} new tokens per request")
    print(
        "(this machine's speed drifts by tens of percent from minute to minute, so every level runs\n"
        " all modes back to back, and the single-stream ratios are medians of interleaved rounds)\n"
    )
    print(HEADER)
    rows: dict[tuple[str, int], Result] = {}
    every: dict[tuple[str, int], list[Result]] = {}  # each round's run, in round order
    with contextlib.ExitStack() as stack:
        modes = start_modes(stack, args, levels, loaded)
        for n in levels:
            for label, runs in _rounds(modes, args.repeat, n, args.tokens).items():
                every[(label, n)] = runs
                show(rows, label, n, _median_run(runs))
        modes["batched in-process"] = lambda n, tokens: asyncio.run(
            in_process(loaded, settings_for(args.dtype, 1), n, tokens)
        )
        if args.rounds:
            single_stream(modes, args.rounds, args.tokens, rows)
    print_targets(rows, levels)
    print_sampling_costs(rows, levels, args.sampling)
    if args.before:
        print_before(every, levels, args.before, len(args.sampling))
    if args.dtypes:
        dtype_rows(loaded, args)


def show(rows: dict[tuple[str, int], Result], label: str, n: int, r: Result) -> None:
    rows[(label, n)] = r
    print(r.row(label, n), flush=True)


def start_modes(
    stack: contextlib.ExitStack, args: argparse.Namespace, levels: list[int], loaded: LoadedModel
) -> dict[str, Measure]:
    """Every server in its own process, as deployed (the site is another process)."""
    http = {
        "batched HTTP": stack.enter_context(
            server_process(*our_server_cmd(args.dtype, max(levels)), port_flag="--port")
        )
    }
    if args.plain:
        cmd, ready = our_server_cmd(args.dtype, max(levels))
        plain = [*cmd, "--prefix-cache-mb", "0", "--prefill-chunk-tokens", "0"]
        http[PLAIN] = stack.enter_context(server_process(plain, ready, port_flag="--port"))
    if not args.skip_seed:
        http["seed thread+generate HTTP"] = stack.enter_context(
            server_process(
                [sys.executable, "-m", "bench.seed_server", "--dtype", args.dtype],
                "/openapi.json",
                port_flag="--port",
            )
        )
    if args.llama_python:
        http["llama-cpp-python server"] = stack.enter_context(
            server_process(*llama_server_cmd(args.llama_python), port_flag="--port")
        )
    if args.before:
        cmd, ready = our_server_cmd(args.dtype, max(levels))
        before = str(commit_tree(stack, args.before))
        http[_at(args.before)] = stack.enter_context(
            server_process(cmd, ready, port_flag="--port", cwd=before)
        )
    modes: dict[str, Measure] = {label: _http_mode(url) for label, url in http.items() if url}
    sampled = ["batched HTTP"] + ([_at(args.before)] if args.before else [])
    for letter, fields in zip(LETTERS, args.sampling):
        for label in sampled:
            if http[label]:
                modes[_sampled(letter, label)] = _http_mode(http[label], fields)
    if args.hf_manager:
        from bench.hf_manager import run_hf_manager

        modes["transformers CB manager"] = lambda n, tokens: run_hf_manager(loaded, n, tokens)
    return modes


def our_server_cmd(dtype: str, max_batch: int) -> tuple[list[str], str]:
    """`python -m inference` as deployed, and the path that answers once it is ready."""
    cmd = [sys.executable, "-m", "inference", "--dtype", dtype, "--max-batch", str(max_batch)]
    return [*cmd, "--max-queue", "256", "--log-level", "warning"], "/ready"


def llama_server_cmd(python: str) -> tuple[list[str], str]:
    """llama-cpp-python's server on the bundled GGUF: all cores, one request at a time (with
    its default interrupt_requests it cuts concurrent streams off mid-body)."""
    from inference.model_store import bundled_gguf

    model = ["--model", str(bundled_gguf()), "--host", "127.0.0.1", "--n_ctx", "4096"]
    return [python, "-m", "llama_cpp.server", *model, "--interrupt_requests", "False"], "/v1/models"


def single_stream(
    modes: dict[str, Measure], rounds: int, tokens: int, rows: dict[tuple[str, int], Result]
) -> None:
    single = {
        label: modes[label]
        for label in ("batched HTTP", "batched in-process", "llama-cpp-python server")
        if label in modes
    }
    print(f"\nsingle stream, {rounds} interleaved rounds:")
    for label, runs in _rounds(single, rounds, 1, tokens).items():
        show(rows, _median(label), 1, _median_run(runs))


def dtype_rows(loaded: LoadedModel, args: argparse.Namespace) -> None:
    print("\nper DTYPE (in-process engine):")
    print(HEADER)
    for dtype in args.dtypes.split(","):
        model = (
            loaded
            if dtype == loaded.dtype
            else prepare_model(settings_for(dtype, 1), progress=lambda _: None)
        )
        for n in sorted({1, args.dtype_n}):
            r = asyncio.run(in_process(model, settings_for(dtype, n), n, args.tokens))
            print(r.row(f"dtype {dtype}", n), flush=True)


def _median(label: str) -> str:
    return f"{label[:21]} median"  # fits the table's mode column


def _http_mode(url: str, sampling: dict[str, Any] | None = None) -> Measure:
    return lambda n, tokens: asyncio.run(run_http(url, n, tokens, sampling or {}))


def _rounds(modes: dict[str, Measure], rounds: int, n: int, tokens: int) -> dict[str, list[Result]]:
    """Every mode once a round, in reverse order every other round (ABBA), so no mode always
    runs right after the same one or first after the machine was quiet."""
    runs: dict[str, list[Result]] = {label: [] for label in modes}
    for round_ in range(rounds):
        order = list(modes.items())
        for label, measure in order[::-1] if round_ % 2 else order:
            wait_for_quiet()  # no server's leftover work lands on the next mode
            runs[label].append(measure(n, tokens))
    return runs


def _median_run(runs: list[Result]) -> Result:
    return sorted(runs, key=lambda r: r.rate)[len(runs) // 2]


LETTERS = "ABCDEFGH"


def _at(commit: str) -> str:
    return f"batched HTTP at {commit}"


def _sampled(letter: str, server: str) -> str:
    """The label of a --sampling mode through `server` (this tree's: plain 'sampling A')."""
    return f"sampling {letter}" + server.removeprefix("batched HTTP")


PLAIN = "no cache/chunks HTTP"


def print_sampling_costs(
    rows: dict[tuple[str, int], Result], levels: list[int], settings: list[dict[str, Any]]
) -> None:
    """Each --sampling mode's tokens/s as a ratio of the first one's, level by level."""
    if not settings:
        return
    print("\nsampling modes (tokens/s as a ratio of sampling A's):")
    for letter, fields in zip(LETTERS, settings):
        ratios = [
            f"N={n} {rows[(f'sampling {letter}', n)].rate / rows[('sampling A', n)].rate:.3f}x"
            for n in levels
            if (f"sampling {letter}", n) in rows and ("sampling A", n) in rows
        ]
        print(f"  {letter}: {json.dumps(fields)}  {', '.join(ratios)}")


def print_before(
    every: dict[tuple[str, int], list[Result]], levels: list[int], commit: str, samplings: int
) -> None:
    """This tree's tokens/s over the earlier commit's, mode by mode, level by level: the
    median of each round's ratio (the two ran back to back), and every round's."""
    print(f"\nthis tree against {commit} (tokens/s, this tree's over its; median of the rounds):")
    pairs = [("batched HTTP", _at(commit))] + [
        (f"sampling {letter}", _sampled(letter, _at(commit))) for letter in LETTERS[:samplings]
    ]
    for mine, theirs in pairs:
        for n in levels:
            ratios = [
                a.rate / b.rate
                for a, b in zip(every.get((mine, n), []), every.get((theirs, n), []))
                if b.rate and not (a.failures or b.failures)
            ]
            if ratios:
                each = ", ".join(f"{r:.2f}" for r in ratios)
                print(f"  {mine}, N={n}: {statistics.median(ratios):.3f}x ({each})")


def print_targets(rows: dict[tuple[str, int], Result], levels: list[int]) -> None:
    """The issue's targets, as ratios of rows measured above in this run."""

    def tps(label: str, n: int) -> float | None:
        r = rows.get((label, n))
        return r.tokens / r.wall if r and r.wall and not r.failures else None

    def ttft99(label: str, n: int) -> float | None:
        r = rows.get((label, n))
        return percentile(r.ttft, 99) if r and r.ttft else None

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "n/a (baseline not run or failed)"

    ours, n8 = "batched HTTP", 8 if 8 in levels else max(levels)
    print("\ntargets (ratios of the rows above):")
    print(
        f"  {n8} concurrent vs seed pattern, aggregate: {ratio(tps(ours, n8), tps('seed thread+generate HTTP', n8))}"
        f" (>= 5x); TTFT p99 {ttft99(ours, n8) or float('nan'):.2f}s (<= 1.5 s)"
    )
    llama = "llama-cpp-python server"
    for n in levels if (PLAIN, levels[0]) in rows else []:
        print(
            f"  {n} concurrent, prefix cache and chunked prefill on vs off: aggregate "
            f"{ratio(tps(ours, n), tps(PLAIN, n))} (>= 0.95x)"
        )
    print(
        f"  1 stream over HTTP vs in-process: "
        f"{ratio(tps(_median(ours), 1), tps(_median('batched in-process'), 1))} (>= 0.95x; medians)"
    )
    print(
        f"  1 stream vs llama-cpp-python: {ratio(tps(_median(ours), 1), tps(_median(llama), 1))}"
        " (>= 0.5x; medians)"
    )
    print(
        f"  {n8} concurrent vs llama-cpp-python: aggregate {ratio(tps(ours, n8), tps(llama, n8))} (>= 1x), "
        f"TTFT p99 {ratio(ttft99(ours, n8), ttft99(llama, n8))} (<= 0.2x)"
    )
    if ("transformers CB manager", n8) in rows:
        print(
            f"  {n8} concurrent vs transformers' manager (in-process): "
            f"{ratio(tps(ours, n8), tps('transformers CB manager', n8))} aggregate, TTFT p99 "
            f"{ratio(ttft99(ours, n8), ttft99('transformers CB manager', n8))}"
        )


@contextlib.contextmanager
def server_process(
    cmd: list[str], ready_path: str, port_flag: str, cwd: str | None = None
) -> Iterator[str | None]:
    """Runs `cmd` (in `cwd`) on a free port until the block ends; yields its URL once
    `ready_path` answers 200, or None when it did not start (that baseline is then skipped).
    It starts once the machine is quiet: our servers time their kernels against each other
    as they load, and a server started while the one before was still probing in the
    background (its first seconds) chose bfloat16 prefill on a Zen 3, 4x float32's time."""
    import socket
    import subprocess

    from bench.measure import wait_for_quiet

    wait_for_quiet()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [*cmd, port_flag, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{url}{ready_path}", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print(f"{cmd[0]} {' '.join(cmd[1:3])} did not start: skipped")
                yield None
                return
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
