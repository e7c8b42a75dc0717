"""Benchmark of the inference server: continuous batching vs the seed's thread-per-request
`model.generate` + TextIteratorStreamer pattern, measured side by side in one run.

    .venv/bin/python bench/inference.py                 # N = 1,4,8,16, 128 tokens
    .venv/bin/python bench/inference.py --n 1,8 --hf-manager --llama-python /path/to/python

Our server (`python -m inference`), the seed's pattern and llama-cpp-python's server
(optional) each run in their own process, as deployed, on the same model file and DTYPE; the
clients are httpx streams in this process, where the in-process rows (our engine, transformers'
manager) also run. Rows: aggregate tokens/s, TTFT p50/p99, inter-token latency
p50/p99 (between received content chunks), failures (streams that ended early or with an
error). Then one stream over HTTP vs the same engine in-process vs llama.cpp in interleaved
rounds, the issue's targets as ratios of those rows, and one row per DTYPE.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import StreamingResponse  # noqa: E402

from inference.engine import Message  # noqa: E402
from inference.hf_engine import TransformersEngine  # noqa: E402
from inference.model_store import LoadedModel, prepare_model  # noqa: E402
from inference.scheduler import SamplingParams, TokenEvent  # noqa: E402
from inference.settings import Settings  # noqa: E402

PROMPTS = ["Tell me a story about a lighthouse keeper.", "Explain how rain forms.",
           "Write a poem about the sea.", "Describe a busy market in the morning."]


@dataclass
class Result:
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    failures: int = 0
    wall: float = 0.0

    def row(self, label: str, n: int) -> str:
        return (f"{label:<28} {n:>3} {self.tokens / self.wall:>8.1f} {_p(self.ttft, 50):>7.2f} "
                f"{_p(self.ttft, 99):>7.2f} {_p(self.itl, 50) * 1000:>8.0f} {_p(self.itl, 99) * 1000:>8.0f} "
                f"{self.failures:>5}")


HEADER = f"{'mode':<28} {'N':>3} {'tok/s':>8} {'ttft50':>7} {'ttft99':>7} {'itl50ms':>8} {'itl99ms':>8} {'fail':>5}"


def _p(values: list[float], pct: int) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


# --- the seed's pattern ---------------------------------------------------------------------
def seed_app(loaded: LoadedModel) -> Any:
    """One thread per request calling model.generate with a TextIteratorStreamer."""
    from transformers import TextIteratorStreamer

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        tok = loaded.tokenizer
        ids = tok.apply_chat_template(body["messages"], add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)
        streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
        n = body["max_tokens"]
        kwargs = dict(**ids, streamer=streamer, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        threading.Thread(target=loaded.model.generate, kwargs=kwargs, daemon=True).start()

        async def stream() -> Any:
            it = iter(streamer)
            while True:
                text = await asyncio.to_thread(next, it, None)
                if text is None:
                    break
                if text:
                    chunk = {"choices": [{"delta": {"content": text}, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
            yield f"data: {json.dumps({'choices': [{'delta': {}, 'finish_reason': 'length'}], 'usage': {'completion_tokens': n}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


# --- clients --------------------------------------------------------------------------------
async def one_http(client: httpx.AsyncClient, url: str, i: int, tokens: int, res: Result) -> None:
    body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "stream": True,
            "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
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


async def run_http(url: str, n: int, tokens: int) -> Result:
    res = Result()
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.monotonic()
        await asyncio.gather(*(one_http(client, url, i, tokens, res) for i in range(n)))
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
                (res.ttft if last is None else res.itl).append(now - (start if last is None else last))
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
    return Settings(engine="transformers", dtype=dtype, device="auto", max_batch=max_batch, max_queue=256,
                    model="", model_name="", inference_api_key="", context_length=0)


async def in_process(loaded: LoadedModel, settings: Settings, n: int, tokens: int) -> Result:
    engine = TransformersEngine(settings, loaded=loaded)
    await engine.start()
    await engine.wait_ready(600)
    try:
        return await run_in_process(engine, n, tokens)
    finally:
        await engine.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,4,8,16", help="concurrency levels")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the interleaved single-stream comparison (medians reported)")
    ap.add_argument("--dtype", default="auto", help="DTYPE of the side-by-side comparison (auto: "
                    "what the server picks, int4 for the bundled model on CPU)")
    ap.add_argument("--dtypes", default="float32,bfloat16,int8,int4", help="per-DTYPE rows (in-process)")
    ap.add_argument("--dtype-n", type=int, default=8, help="concurrency of the per-DTYPE rows")
    ap.add_argument("--skip-seed", action="store_true", help="skip the seed baseline (slow)")
    ap.add_argument("--hf-manager", action="store_true",
                    help="add transformers' ContinuousBatchingManager, in-process, as a baseline")
    ap.add_argument("--llama-python", default="",
                    help="a python with llama-cpp-python[server] installed: adds its server, "
                         "on the same GGUF file, as a baseline")
    ap.add_argument("--serve-seed", type=int, default=0, help=argparse.SUPPRESS)  # the seed's process
    args = ap.parse_args()
    if args.serve_seed:
        return serve_seed(args.serve_seed, args.dtype)
    levels = [int(x) for x in args.n.split(",")]
    loaded = prepare_model(settings_for(args.dtype, 1))
    print(f"\nmodel {loaded.folder} dtype {loaded.dtype}, {args.tokens} new tokens per request")
    print("(this machine's speed drifts by tens of percent from minute to minute, so every level runs\n"
          " all modes back to back, and the single-stream ratios are medians of interleaved rounds)\n")
    print(HEADER)
    rows: dict[tuple[str, int], Result] = {}

    def show(label: str, n: int, r: Result) -> None:
        rows[(label, n)] = r
        print(r.row(label, n), flush=True)

    with contextlib.ExitStack() as stack:
        # every server in its own process, as deployed (the site is another process)
        http = {"batched HTTP": stack.enter_context(server_process(
            [sys.executable, "-m", "inference", "--dtype", args.dtype, "--max-batch", str(max(levels)),
             "--max-queue", "256", "--log-level", "warning"], "/ready", port_flag="--port"))}
        if not args.skip_seed:
            http["seed thread+generate HTTP"] = stack.enter_context(server_process(
                [sys.executable, __file__, "--dtype", args.dtype], "/openapi.json", port_flag="--serve-seed"))
        if args.llama_python:
            from inference.model_store import bundled_gguf

            # all cores, one request at a time: with its default interrupt_requests it cuts
            # concurrent streams off mid-body
            http["llama-cpp-python server"] = stack.enter_context(server_process(
                [args.llama_python, "-m", "llama_cpp.server", "--model", str(bundled_gguf()),
                 "--host", "127.0.0.1", "--n_ctx", "4096", "--interrupt_requests", "False"],
                "/v1/models", port_flag="--port"))
        modes: dict[str, Any] = {label: _http_mode(url) for label, url in http.items() if url}
        if args.hf_manager:
            from bench.hf_manager import run_hf_manager

            modes["transformers CB manager"] = lambda n, tokens: run_hf_manager(loaded, n, tokens)
        for n in levels:
            for label, measure in modes.items():
                show(label, n, measure(n, args.tokens))
        modes["batched in-process"] = lambda n, tokens: asyncio.run(
            in_process(loaded, settings_for(args.dtype, 1), n, tokens))
        single = {label: modes[label] for label in ("batched HTTP", "batched in-process",
                                                      "llama-cpp-python server") if label in modes}
        print(f"\nsingle stream, {args.rounds} interleaved rounds:")
        for label, runs in _rounds(single, args.rounds, args.tokens).items():
            show(_median(label), 1, sorted(runs, key=lambda r: r.tokens / r.wall)[len(runs) // 2])
    print_targets(rows, levels)
    print("\nper DTYPE (in-process engine):")
    print(HEADER)
    for dtype in args.dtypes.split(","):
        model = loaded if dtype == loaded.dtype else prepare_model(settings_for(dtype, 1), progress=lambda _: None)
        for n in sorted({1, args.dtype_n}):
            print(asyncio.run(in_process(model, settings_for(dtype, n), n, args.tokens)).row(f"dtype {dtype}", n), flush=True)


def _median(label: str) -> str:
    return f"{label[:21]} median"  # fits the table's mode column


def _http_mode(url: str) -> Any:
    return lambda n, tokens: asyncio.run(run_http(url, n, tokens))


def serve_seed(port: int, dtype: str) -> None:
    import uvicorn

    loaded = prepare_model(settings_for(dtype, 1), progress=lambda _: None)
    uvicorn.run(seed_app(loaded), host="127.0.0.1", port=port, log_level="warning")


def _rounds(modes: dict[str, Any], rounds: int, tokens: int) -> dict[str, list[Result]]:
    runs: dict[str, list[Result]] = {label: [] for label in modes}
    for _ in range(rounds):
        for label, measure in modes.items():
            runs[label].append(measure(1, tokens))
    return runs


def print_targets(rows: dict[tuple[str, int], Result], levels: list[int]) -> None:
    """The issue's targets, as ratios of rows measured above in this run."""
    def tps(label: str, n: int) -> float | None:
        r = rows.get((label, n))
        return r.tokens / r.wall if r and r.wall and not r.failures else None

    def ttft99(label: str, n: int) -> float | None:
        r = rows.get((label, n))
        return _p(r.ttft, 99) if r and r.ttft else None

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "n/a (baseline not run or failed)"

    ours, n8 = "batched HTTP", 8 if 8 in levels else max(levels)
    print("\ntargets (ratios of the rows above):")
    print(f"  {n8} concurrent vs seed pattern, aggregate: {ratio(tps(ours, n8), tps('seed thread+generate HTTP', n8))}"
          f" (>= 5x); TTFT p99 {ttft99(ours, n8) or float('nan'):.2f}s (<= 1.5 s)")
    llama = "llama-cpp-python server"
    print(f"  1 stream over HTTP vs in-process: "
          f"{ratio(tps(_median(ours), 1), tps(_median('batched in-process'), 1))} (>= 0.95x; medians)")
    print(f"  1 stream vs llama-cpp-python: {ratio(tps(_median(ours), 1), tps(_median(llama), 1))}"
          " (>= 0.5x; medians)")
    print(f"  {n8} concurrent vs llama-cpp-python: aggregate {ratio(tps(ours, n8), tps(llama, n8))} (>= 1x), "
          f"TTFT p99 {ratio(ttft99(ours, n8), ttft99(llama, n8))} (<= 0.2x)")
    if ("transformers CB manager", n8) in rows:
        print(f"  {n8} concurrent vs transformers' manager (in-process): "
              f"{ratio(tps(ours, n8), tps('transformers CB manager', n8))} aggregate, TTFT p99 "
              f"{ratio(ttft99(ours, n8), ttft99('transformers CB manager', n8))}")


@contextlib.contextmanager
def server_process(cmd: list[str], ready_path: str, port_flag: str) -> Iterator[str | None]:
    """Runs `cmd` on a free port until the block ends; yields its URL once `ready_path`
    answers 200, or None when it did not start (that baseline is then skipped)."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([*cmd, port_flag, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
