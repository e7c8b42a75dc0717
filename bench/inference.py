"""Benchmark of the inference server: continuous batching vs the seed's thread-per-request
`model.generate` + TextIteratorStreamer pattern, measured side by side in one run.

    .venv/bin/python bench/inference.py                 # N = 1,4,8,16, 128 tokens
    .venv/bin/python bench/inference.py --n 1,8 --tokens 64 --dtypes bfloat16,int8

Every server runs in this process (uvicorn in a thread) on the same loaded model; the clients
are httpx streams on the main thread. Rows: aggregate tokens/s, TTFT p50/p99, inter-token
latency p50/p99 (between received content chunks), failures (streams that ended early or with
an error). Also one stream over HTTP vs the same engine in-process, and one row per DTYPE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import StreamingResponse  # noqa: E402

from inference.app import create_app  # noqa: E402
from inference.engine import Message  # noqa: E402
from inference.hf_engine import TransformersEngine  # noqa: E402
from inference.model_store import LoadedModel, prepare_model  # noqa: E402
from inference.scheduler import SamplingParams, TokenEvent  # noqa: E402
from inference.settings import Settings  # noqa: E402
from tests.inference.conftest import LiveServer  # noqa: E402

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


def ours_server(loaded: LoadedModel, settings: Settings) -> LiveServer:
    return LiveServer(create_app(settings, engine=TransformersEngine(settings, loaded=loaded)))


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
    ap.add_argument("--dtype", default="bfloat16", help="dtype of the side-by-side comparison")
    ap.add_argument("--dtypes", default="float32,bfloat16,int8", help="per-DTYPE rows (in-process)")
    ap.add_argument("--dtype-n", type=int, default=8, help="concurrency of the per-DTYPE rows")
    ap.add_argument("--skip-seed", action="store_true", help="skip the seed baseline (slow)")
    ap.add_argument("--llama-python", default="",
                    help="a python with llama-cpp-python[server] installed: adds its server, "
                         "on the same GGUF file, as a baseline")
    args = ap.parse_args()
    levels = [int(x) for x in args.n.split(",")]
    loaded = prepare_model(settings_for(args.dtype, 1))
    print(f"\nmodel {loaded.folder} dtype {args.dtype}, {args.tokens} new tokens per request\n")
    print(HEADER)
    seed_tps: dict[int, float] = {}
    if not args.skip_seed:
        with LiveServer(seed_app(loaded)) as seed:
            for n in levels:
                r = asyncio.run(run_http(seed.url, n, args.tokens))
                seed_tps[n] = r.tokens / r.wall
                print(r.row("seed thread+generate HTTP", n), flush=True)
    with ours_server(loaded, settings_for(args.dtype, max(levels))) as ours:
        ours.wait_ready(600)
        for n in levels:
            r = asyncio.run(run_http(ours.url, n, args.tokens))
            ratio = f"  x{r.tokens / r.wall / seed_tps[n]:.1f} seed" if n in seed_tps else ""
            print(r.row("batched HTTP", n) + ratio, flush=True)
        http1 = asyncio.run(run_http(ours.url, 1, args.tokens))
    inproc1 = asyncio.run(in_process(loaded, settings_for(args.dtype, 1), 1, args.tokens))
    print(http1.row("batched HTTP (again)", 1))
    print(inproc1.row("batched in-process", 1))
    print(f"server overhead: 1 stream over HTTP = {http1.tokens / http1.wall / (inproc1.tokens / inproc1.wall):.2f}x in-process")
    if args.llama_python:
        llama_cpp_rows(args.llama_python, levels, args.tokens)
    else:
        print("llama.cpp baseline skipped (give --llama-python; DESIGN.md measured ~59 tok/s "
              "single stream on the same Q4_1 file)")
    print("\nper DTYPE (in-process engine):")
    print(HEADER)
    for dtype in args.dtypes.split(","):
        model = prepare_model(settings_for(dtype, 1), progress=lambda _: None) if dtype != args.dtype else loaded
        for n in sorted({1, args.dtype_n}):
            print(asyncio.run(in_process(model, settings_for(dtype, n), n, args.tokens)).row(f"dtype {dtype}", n), flush=True)


def llama_cpp_rows(python: str, levels: list[int], tokens: int) -> None:
    """llama-cpp-python's OpenAI server on the same GGUF, all cores, one request at a time
    (with its default interrupt_requests it cuts concurrent streams off mid-body)."""
    import socket
    import subprocess

    from inference.model_store import bundled_gguf

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [python, "-m", "llama_cpp.server", "--model", str(bundled_gguf()), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "4096", "--interrupt_requests", "False"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("llama.cpp server did not start: baseline skipped")
                return
            time.sleep(0.5)
        for n in levels:
            print(asyncio.run(run_http(url, n, tokens)).row("llama-cpp-python server", n), flush=True)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
