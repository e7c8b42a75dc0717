"""Long conversations and long pastes: the prefix cache and chunked prefill, over HTTP.

    .venv/bin/python -m bench.long_context                       # ~4,000-token prompts
    .venv/bin/python -m bench.long_context --llama-python PATH   # and llama-cpp-python's server

Servers run in their own processes, as deployed: ours with chunked prefill (the default
PREFILL_CHUNK_TOKENS) and ours unchunked (PREFILL_CHUNK_TOKENS=0), both with the prefix cache
(PREFIX_CACHE_MB), and optionally llama-cpp-python's server on the same GGUF. Two measurements,
each in interleaved rounds (medians):

1. Next turn: a fresh conversation of ~--tokens tokens (a new nonce at its start, so nothing
   after the system prompt is cached) is sent, its reply read; then the next turn (the same
   history, that reply, one more question) is sent. TTFT of each, and the ratio.
2. A long paste while others stream: 4 streams run, then a fresh ~--tokens prompt arrives.
   The largest gap between two tokens of the 4 streams while it is prefilled (their median
   gap beforehand for scale; each round's says where in the paste it began), and its own
   TTFT, chunked vs unchunked; and the TTFT of another user's short question asked
   --question-after seconds into the paste (a short prompt should not wait for a long one).
   For our servers, where the model's time went from the paste's arrival to its first token
   (/metrics' step times): its prefill steps against the streams' decode steps between them.

All requests are greedy and, as the site sends them (INFERENCE_PROMPT_PROGRESS, on by
default), ask for the prompt's progress (`return_progress`: ours sends a `prompt_progress`
chunk per prefill step, llama-cpp-python's server ignores the field); `--no-progress` leaves
it out. The paste's progress reports are counted. Before each measurement the benchmark
waits for the machine to be quiet, so no server's leftover work (our cache filling in the
background, llama.cpp finishing a prompt whose client left) lands on the next one.
bench/README.md keeps the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.inference import server_process
from bench.measure import commit_tree, wait_for_quiet

DOCS = Path(__file__).parents[1] / "docs"
CHARS_PER_TOKEN = 3.8  # of these docs through the bundled model's tokenizer
PART_CHARS = 1800
STREAMS = 4
QUESTION = "What is the capital of France?"
# What the site's inference client adds to every request (settings.INFERENCE_PROMPT_PROGRESS),
# so that the servers do the work they do behind the site; main() empties it on --no-progress.
SITE_FIELDS: dict[str, Any] = {"return_progress": True}


def conversation(tokens: int) -> list[dict[str, str]]:
    """A fresh ~`tokens`-token conversation: parts of the docs as user turns, short replies."""
    text = (DOCS / "architecture.md").read_text() + (DOCS / "events.md").read_text()
    text = text[: int(tokens * CHARS_PER_TOKEN)]
    parts = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)]
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for i, part in enumerate(parts):
        nonce = f"Session {uuid.uuid4().hex}. " if i == 0 else ""
        msgs += [
            {"role": "user", "content": f"{nonce}Part {i + 1} of my notes:\n{part}"},
            {"role": "assistant", "content": f"Noted part {i + 1}."},
        ]
    return [*msgs, {"role": "user", "content": "What are these notes about? One sentence."}]


async def stream(
    client: httpx.AsyncClient,
    url: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    stop: asyncio.Event | None = None,
    out: dict[str, Any] | None = None,
    first: asyncio.Event | None = None,
) -> dict[str, Any]:
    """One greedy stream: the arrival time of each content chunk, its text, prompt tokens,
    progress reports (filled into `out` as they come); `first` is set at its first content."""
    body = {
        **SITE_FIELDS,
        "messages": messages,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    out = out if out is not None else {}
    out.update(
        {"start": time.monotonic(), "times": [], "text": "", "prompt_tokens": None, "progress": 0}
    )
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                out["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
            out["progress"] += "prompt_progress" in chunk
            content = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
            if content:
                out["times"].append(time.monotonic())
                out["text"] += content
                if first is not None:
                    first.set()
            if stop is not None and stop.is_set():
                break
    return out


SECONDS_SAMPLE, STEPS_SAMPLE = "inference_model_step_seconds_total", "inference_model_steps_total"


async def model_steps(client: httpx.AsyncClient, url: str) -> dict[str, tuple[float, int]] | None:
    """The server's model time and steps by kind ({kind: (seconds, steps)}) from its
    /metrics, or None where it has none (llama-cpp-python, an older tree)."""
    try:
        r = await client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return None
    return parse_model_steps(r.text) if r.status_code == 200 else None


def parse_model_steps(text: str) -> dict[str, tuple[float, int]] | None:
    seconds: dict[str, float] = {}
    steps: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == SECONDS_SAMPLE:
                seconds[sample.labels["kind"]] = sample.value
            elif sample.name == STEPS_SAMPLE:
                steps[sample.labels["kind"]] = int(sample.value)
    if not seconds:
        return None
    return {kind: (seconds[kind], steps.get(kind, 0)) for kind in seconds}


def steps_between(
    before: dict[str, tuple[float, int]] | None, after: dict[str, tuple[float, int]] | None
) -> dict[str, tuple[float, int]] | None:
    if before is None or after is None:
        return None
    return {
        kind: (after[kind][0] - before[kind][0], after[kind][1] - before[kind][1])
        for kind in after
        if kind in before
    }


async def steps_until(
    first: asyncio.Event, client: httpx.AsyncClient, url: str, before: Any
) -> dict[str, tuple[float, int]] | None:
    """The model's steps from `before` until `first` is set (a stream's first token)."""
    if before is None:
        return None
    await first.wait()
    return steps_between(before, await model_steps(client, url))


def ttft(s: dict[str, Any]) -> float:
    return s["times"][0] - s["start"] if s["times"] else float("nan")


async def next_turn(url: str, tokens: int, reply_tokens: int) -> tuple[float, float, int]:
    """(cold TTFT, next-turn TTFT, prompt tokens) of one fresh conversation."""
    async with httpx.AsyncClient(timeout=600) as client:
        msgs = conversation(tokens)
        first = await stream(client, url, msgs, reply_tokens)
        await asyncio.sleep(1.0)  # a user reads the reply; the server caches it meanwhile
        msgs = [
            *msgs,
            {"role": "assistant", "content": first["text"]},
            {"role": "user", "content": "And in more detail?"},
        ]
        second = await stream(client, url, msgs, reply_tokens)
    return ttft(first), ttft(second), first["prompt_tokens"] or 0


async def paste_while_streaming(
    url: str, tokens: int, stream_tokens: int, question_after: float
) -> dict[str, float]:
    """The 4 streams' largest gap while a fresh long prompt is prefilled, its TTFT, and
    that of a short question asked `question_after` seconds into it (0: none asked)."""
    stop = asyncio.Event()
    progress: list[dict[str, Any]] = [{"times": []} for _ in range(STREAMS)]
    async with httpx.AsyncClient(timeout=600) as client:
        runners = [
            asyncio.create_task(
                stream(
                    client,
                    url,
                    [{"role": "user", "content": f"Tell story {i}."}],
                    stream_tokens,
                    stop,
                    progress[i],
                )
            )
            for i in range(STREAMS)
        ]
        # the long prompt arrives once every stream is under way (or after a minute: a server
        # that runs one request at a time never starts them all)
        deadline = time.monotonic() + 60
        while any(len(p["times"]) < 3 for p in progress) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        before, first = await model_steps(client, url), asyncio.Event()
        paste = asyncio.create_task(stream(client, url, conversation(tokens), 4, first=first))
        spent = asyncio.create_task(steps_until(first, client, url, before))
        question = {"start": math.inf, "times": []}
        if question_after > 0:  # another user's, while the paste is being prefilled
            await asyncio.sleep(question_after)
            question = await stream(client, url, [{"role": "user", "content": QUESTION}], 4)
        try:
            long_ = await paste
        finally:
            if not first.is_set():  # no first token: nothing to wait for
                spent.cancel()
        steps = await spent if first.is_set() else None
        await asyncio.sleep(0.5)
        stop.set()
        streams = await asyncio.gather(*runners)
    window = (long_["start"], long_["times"][0] if long_["times"] else time.monotonic())
    largest, before = largest_gap(streams, window, question), []
    for s in streams:
        before += [b - a for a, b in zip(s["times"], s["times"][1:]) if b < window[0]]
    return {
        **largest,
        "median_gap": statistics.median(before) if before else float("nan"),
        "ttft": ttft(long_),
        # nan where the paste's first token came first (the question did not overlap it)
        "question_ttft": ttft(question) if question["start"] < window[1] else float("nan"),
        "progress_reports": long_["progress"],
        "streaming": sum(1 for s in streams if s["times"] and s["times"][0] < window[0]),
        "steps": steps,
    }


def largest_gap(
    streams: list[dict[str, Any]], window: tuple[float, float], question: dict[str, Any]
) -> dict[str, Any]:
    """The largest gap between two tokens of a stream that overlaps `window` (the paste's
    prefill), where in the window it began (seconds from its start), and whether it overlaps
    the question's own wait for its first token: which step an outlier held the streams in."""
    gaps = [
        (b - a, a)
        for s in streams
        for a, b in zip(s["times"], s["times"][1:])
        if b >= window[0] and a <= window[1]
    ]
    if not gaps:
        return {"max_gap": float("nan"), "max_gap_at": float("nan"), "max_gap_question": False}
    gap, began = max(gaps)
    asked = question["start"], (question["times"] or [math.inf])[0]
    return {
        "max_gap": gap,
        "max_gap_at": began - window[0],
        "max_gap_question": began <= asked[1] and began + gap >= asked[0],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--tokens", type=int, default=4000, help="size of the long prompts, in tokens (about)"
    )
    ap.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of each measurement (medians)"
    )
    ap.add_argument(
        "--reply-tokens", type=int, default=32, help="reply length of the next-turn measurement"
    )
    ap.add_argument(
        "--stream-tokens",
        type=int,
        default=4000,
        help="the most tokens of each of the 4 streams (they are closed once the paste has its "
        "first token; llama-cpp-python's server runs one request at a time, keep it low there)",
    )
    ap.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="PREFILL_CHUNK_TOKENS of the chunked server (default: the server's own default)",
    )
    ap.add_argument(
        "--step-ms",
        type=int,
        default=None,
        help="PREFILL_STEP_MS of this tree's chunked server (default: the server's own default)",
    )
    ap.add_argument(
        "--llama-python", default="", help="a python with llama-cpp-python[server]: adds its server"
    )
    ap.add_argument("--skip-paste", action="store_true", help="only the next-turn measurement")
    ap.add_argument("--skip-next-turn", action="store_true", help="only the paste's measurement")
    ap.add_argument(
        "--question-after",
        type=float,
        default=1.0,
        help="seconds into the paste another user asks a short question (0: none)",
    )
    ap.add_argument(
        "--no-progress",
        action="store_true",
        help="leave out return_progress (the site asks for the prompt's progress by default)",
    )
    ap.add_argument(
        "--before",
        default="",
        help="a commit (git archive) whose chunked server runs beside this tree's, as "
        "'ours at REV, chunked'",
    )
    return ap.parse_args(argv)


def start_servers(stack: contextlib.ExitStack, args: argparse.Namespace) -> dict[str, str]:
    ours = [sys.executable, "-m", "inference", "--max-batch", "8", "--log-level", "warning"]
    chunk = [] if args.chunk is None else ["--prefill-chunk-tokens", str(args.chunk)]
    step = [] if args.step_ms is None else ["--prefill-step-ms", str(args.step_ms)]
    cmds = {
        "ours, chunked": ours + chunk + step,
        "ours, unchunked": [*ours, "--prefill-chunk-tokens", "0"],
    }
    if args.llama_python:
        from inference.model_store import bundled_gguf

        cmds["llama-cpp-python"] = [
            args.llama_python,
            "-m",
            "llama_cpp.server",
            "--model",
            str(bundled_gguf()),
            "--host",
            "127.0.0.1",
            "--n_ctx",
            "8192",
            "--interrupt_requests",
            "False",
        ]
    cwds = {}
    if args.before:
        label = f"ours at {args.before}, chunked"
        cmds, cwds[label] = {label: ours + chunk, **cmds}, str(commit_tree(stack, args.before))
    urls = {}
    for label, cmd in cmds.items():
        ready = "/v1/models" if label.startswith("llama") else "/ready"
        url = stack.enter_context(
            server_process(cmd, ready, port_flag="--port", cwd=cwds.get(label))
        )
        if url:
            urls[label] = url
    return urls


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]  # nan: not measured in that round
    return statistics.median(values) if values else float("nan")


def report_next_turn(urls: dict[str, str], args: argparse.Namespace) -> None:
    runs: dict[str, list[tuple[float, float, int]]] = {label: [] for label in urls}
    for _ in range(args.rounds):
        for label, url in urls.items():
            wait_for_quiet()
            runs[label].append(asyncio.run(next_turn(url, args.tokens, args.reply_tokens)))
    print(f"\n1. next turn of a conversation ({args.rounds} rounds, medians)")
    print(f"{'server':<20} {'prompt':>7} {'cold TTFT':>10} {'next TTFT':>10} {'next/cold':>10}")
    for label, rows in runs.items():
        cold, nxt = med([r[0] for r in rows]), med([r[1] for r in rows])
        tokens = max(r[2] for r in rows) or "?"
        print(f"{label:<20} {tokens:>7} {cold:>9.2f}s {nxt:>9.2f}s {nxt / cold:>9.2f}x", flush=True)
    for label, rows in runs.items():  # the spread behind each median
        cold = ", ".join(f"{r[0]:.2f}" for r in rows)
        print(f"  {label}: cold {cold} s, next turns {', '.join(f'{r[1]:.2f}' for r in rows)} s")
    ours, llama = runs.get("ours, chunked"), runs.get("llama-cpp-python")
    if ours:
        ratio = med([r[1] for r in ours]) / med([r[0] for r in ours])
        print(f"  target: next/cold <= 0.15x: {ratio:.2f}x", end="")
        if llama:
            print(
                f"; next TTFT vs llama-cpp-python's <= 1x: "
                f"{med([r[1] for r in ours]) / med([r[1] for r in llama]):.2f}x",
                end="",
            )
        print()


def report_paste(urls: dict[str, str], args: argparse.Namespace) -> None:
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in urls}
    for _ in range(args.rounds):
        for label, url in urls.items():
            stream_tokens = (
                args.stream_tokens if label.startswith("ours") else min(args.stream_tokens, 64)
            )
            wait_for_quiet()
            runs[label].append(
                asyncio.run(
                    paste_while_streaming(url, args.tokens, stream_tokens, args.question_after)
                )
            )
    print(
        f"\n2. a ~{args.tokens}-token paste while {STREAMS} streams run ({args.rounds} rounds, medians)"
    )
    print(
        f"{'server':<20} {'streaming':>9} {'gap before':>11} {'max gap':>9} {'paste TTFT':>11}"
        f" {'question TTFT':>14}"
    )
    for label, rows in runs.items():
        print(
            f"{label:<20} {med([r['streaming'] for r in rows]):>9.0f} "
            f"{med([r['median_gap'] for r in rows]) * 1000:>9.0f}ms {med([r['max_gap'] for r in rows]) * 1000:>7.0f}ms "
            f"{med([r['ttft'] for r in rows]):>10.2f}s {med([r['question_ttft'] for r in rows]):>13.2f}s",
            flush=True,
        )
    for label, rows in runs.items():  # the spread behind each median
        gaps = ", ".join(_gap_text(r) for r in rows)
        pastes = ", ".join(f"{r['ttft']:.2f}" for r in rows)
        questions = ", ".join(f"{r['question_ttft']:.2f}" for r in rows)
        reports = med([r["progress_reports"] for r in rows])
        print(
            f"  {label}: max gap {gaps}; paste {pastes} s; question {questions} s; "
            f"the paste's progress reports {reports:.0f}"
        )
    print(f"  (question: {QUESTION!r}, asked {args.question_after:g} s into the paste)")
    report_steps(runs)
    chunked, whole = runs.get("ours, chunked"), runs.get("ours, unchunked")
    if chunked and whole:
        print(
            f"  targets: max gap <= 250 ms: {med([r['max_gap'] for r in chunked]) * 1000:.0f} ms (unchunked "
            f"{med([r['max_gap'] for r in whole]) * 1000:.0f} ms); paste TTFT chunked/unchunked <= 1.3x: "
            f"{med([r['ttft'] for r in chunked]) / med([r['ttft'] for r in whole]):.2f}x"
        )


def _gap_text(row: dict[str, Any]) -> str:
    """'174 ms at 3.2 s': a round's largest gap and where in the paste it began ('…, question'
    where it overlapped the short question's wait)."""
    if math.isnan(row["max_gap"]):
        return "nan"
    during = ", question" if row.get("max_gap_question") else ""
    return f"{row['max_gap'] * 1000:.0f} ms at {row.get('max_gap_at', math.nan):.1f} s{during}"


def report_steps(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Where each of our servers' model time went until the paste's first token."""
    for label, rows in runs.items():
        spent = [r["steps"] for r in rows if r.get("steps")]
        if not spent:
            continue
        parts = []
        for kind in ("prefill", "decode"):
            seconds, count = med([s[kind][0] for s in spent]), med([s[kind][1] for s in spent])
            each = f", {seconds / count * 1000:.0f} ms each" if count else ""
            parts.append(f"{kind} {seconds:.2f} s in {count:.0f} steps{each}")
        print(f"  {label}, the model until the paste's first token (medians): {'; '.join(parts)}")


def main() -> None:
    args = parse_args()
    if args.no_progress:
        SITE_FIELDS.clear()
    with contextlib.ExitStack() as stack:
        urls = start_servers(stack, args)
        asked = "asking for the prompt's progress" if SITE_FIELDS else "no progress asked"
        print(f"servers: {', '.join(urls)}; greedy, {asked}; prompts of ~{args.tokens} tokens")
        if not args.skip_next_turn:
            report_next_turn(urls, args)
        if not args.skip_paste:
            report_paste(urls, args)


if __name__ == "__main__":
    main()
