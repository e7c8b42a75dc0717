"""One stream at the memory limit: decode tokens/s against what this machine's memory allows.

    .venv/bin/python -m bench.bandwidth --rounds 5 --tokens 64 --llama-python /tmp/llamavenv/bin/python

A decode step reads every weight once (and the KV of the context so far), so a stream can go
no faster than read bandwidth / bytes read per token. This measures the machine's read
bandwidth (the sum of a tensor far larger than any cache, with torch's threads, best of a few),
works out the bytes per token of our server (the int4 packed codes with their scales and
offsets, the int8 LM head with its scales, the norms, the KV at the mean context) and of
llama-cpp-python on the same GGUF (its tensors as stored, its f16 KV), and runs one stream
through each server in interleaved rounds. Per server it prints tokens/s (end to end, as
bench.inference counts them), decode tokens/s (after the first token), bytes per token, the
limit in tokens/s and the fraction of it reached. `--kernels auto,native,torch` runs our
server once per 4-bit kernel (INT4_KERNEL) in the same rounds. Requests are greedy unless
`--sampling K=V,...` gives both servers other fields (the site's defaults:
`--sampling temperature=0.5,top_p=0.9,frequency_penalty=0.8,presence_penalty=0.3,min_p=0.1`).
bench/README.md keeps the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from typing import Any

import torch

from bench.inference import run_http, server_process
from bench.measure import PROMPTS, Result, sampling_fields, wait_for_quiet
from inference import q4mm, quant
from inference.chat_encoder import encode_chat
from inference.engine import Message
from inference.model_store import bundled_gguf, prepare_model
from inference.settings import Settings

MB = 2**20


def read_bandwidth(mb: int = 1024, repeats: int = 7) -> float:
    """Bytes per second read by summing an `mb` MiB float32 tensor (best of `repeats`)."""
    x = torch.ones(mb * MB // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def kv_bytes(config: Any, context: int, element: int = 2) -> int:
    """Keys and values of `context` positions in every layer (bfloat16 here, f16 in llama.cpp)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_position = 2 * config.num_key_value_heads * head_dim * element
    return config.num_hidden_layers * per_position * context


def our_bytes(model: Any, context: int) -> dict[str, int]:
    """What one decode step of our int4 model reads, by kind. A fused matmul reads exactly its
    parts' codes and scales, so counting every Int4Linear once counts what a step reads."""
    int4 = [m for m in model.modules() if isinstance(m, quant.Int4Linear)]
    head = model.lm_head
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    codes, scales = zip(*(_int4_bytes(m) for m in int4), strict=True) if int4 else ((0,), (0,))
    return {
        "int4 codes": sum(codes),
        "int4 scales+offsets": sum(scales),
        "int8 LM head + scales": (
            head.blocks.nbytes if head.blocks is not None else head.q.nbytes + head.scale.nbytes
        ),
        "norms, embedding row": sum(p.nbytes for p in norms) + head.in_features * 2,
        "KV": kv_bytes(model.config, context),
    }


def _int4_bytes(layer: quant.Int4Linear) -> tuple[int, int]:
    """A 4-bit layer's codes and its scales and offsets, in bytes, in either kernel's layout."""
    if layer.blocks is not None:  # q4mm's blocks: 16 bytes of codes, a float16 pair
        blocks = layer.blocks.nbytes // q4mm.BLOCK_BYTES
        return blocks * (q4mm.BLOCK_BYTES - 4), blocks * 4
    return layer.packed.nbytes, layer.scales_zeros.nbytes


def gguf_bytes(path: str, config: Any, context: int) -> dict[str, int]:
    """What llama.cpp reads per token from this GGUF: every tensor as stored (the tied
    embedding is its LM head), and its KV cache in f16 (its default)."""
    from gguf import GGUFReader

    tensors = GGUFReader(path).tensors
    return {
        "weights as stored": sum(int(t.n_bytes) for t in tensors),
        "KV": kv_bytes(config, context),
    }


def decode_rate(r: Result) -> float:
    """Tokens per second after the first (the prompt's prefill left out)."""
    span = r.wall - (r.ttft[0] if r.ttft else 0.0)
    return (r.tokens - 1) / span if r.tokens > 1 and span > 0 else float("nan")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    ap.add_argument("--mb", type=int, default=1024, help="MiB summed to measure bandwidth")
    ap.add_argument(
        "--kernels",
        default="auto",
        help="our server once per INT4_KERNEL value, comma-separated (auto,native,torch): "
        "which 4-bit kernel decodes faster here, side by side",
    )
    ap.add_argument(
        "--llama-python",
        default="",
        help="a python with llama-cpp-python[server]: adds its server on the same GGUF",
    )
    ap.add_argument(
        "--sampling",
        type=sampling_fields,
        default={},
        metavar="K=V,...",
        help="request fields for every server instead of greedy decoding, e.g. the site's "
        "defaults: temperature=0.5,top_p=0.9,frequency_penalty=0.8,presence_penalty=0.3,min_p=0.1",
    )
    return ap.parse_args()


def main() -> None:
    from bench.inference import llama_server_cmd, our_server_cmd

    args = parse_args()
    sizes: dict[str, dict[str, int]] = {}
    servers: dict[str, tuple[list[str], str]] = {}
    for kernel in args.kernels.split(","):
        # each kernel keeps its own layout (torch's LM head: int8 rows; ours: Q8_0 blocks)
        loaded = prepare_model(
            Settings(model="", dtype="auto", device="cpu", int4_kernel=kernel), lambda _: None
        )
        prompt_tokens = len(encode_chat(loaded.tokenizer, [Message("user", PROMPTS[0])]))
        context = prompt_tokens + args.tokens // 2  # the KV a step reads, on average
        name = "ours" if kernel == "auto" else f"ours, {kernel}"
        sizes[name] = our_bytes(loaded.model, context)
        cmd, ready = our_server_cmd("auto", 1)
        servers[name] = ([*cmd, "--int4-kernel", kernel], ready)
        if kernel == "auto":
            print(
                f"INT4_KERNEL=auto chose, in this process, {quant.kernel_of(loaded.model)} "
                f"for the layers and {quant.head_kernel_of(loaded.model)} for the LM head"
            )
    if args.llama_python:
        sizes["llama-cpp-python"] = gguf_bytes(str(bundled_gguf()), loaded.model.config, context)
        servers["llama-cpp-python"] = llama_server_cmd(args.llama_python)
    del loaded  # the servers load their own copies
    bandwidth = read_bandwidth(args.mb)
    print(f"model: {bundled_gguf().name}, {args.tokens} new tokens, prompt {prompt_tokens} tokens")
    print(f"sampling: {args.sampling or 'greedy'}")
    print(f"KV read per step at the mean context ({context} positions)")
    for name, parts in sizes.items():
        detail = ", ".join(f"{k} {v / MB:.2f}" for k, v in parts.items())
        print(f"bytes per token, {name}: {sum(parts.values()) / MB:.2f} MiB ({detail})")
    results = measure(servers, args.rounds, args.tokens, args.sampling)
    bandwidth = max(bandwidth, read_bandwidth(args.mb))  # the machine's best, before and after
    report(results, sizes, bandwidth, args)


def measure(
    servers: dict[str, tuple[list[str], str]],
    rounds: int,
    tokens: int,
    sampling: dict[str, Any],
) -> dict[str, list[Result]]:
    """One stream through each server in turn, `rounds` times (after one warm-up each), the
    order rotated every round; `sampling`'s fields in every request (empty: greedy)."""
    results: dict[str, list[Result]] = {name: [] for name in servers}
    with contextlib.ExitStack() as stack:
        urls = {
            name: stack.enter_context(server_process(cmd, ready, port_flag="--port"))
            for name, (cmd, ready) in servers.items()
        }
        live = {name: url for name, url in urls.items() if url}
        for url in live.values():
            asyncio.run(run_http(url, 1, 8, {}))
        # what a server does once after it starts (ours probes its prefill calls while idle,
        # ~4.5 s of work on a 2-core Zen 3) is not part of a stream's steady state
        wait_for_quiet()
        names = list(live)
        for r in range(rounds):
            # each server first in turn: in a fixed order two servers of the same settings
            # were measured 71 and 62 tokens/s, by their places in the round
            for name in names[r % len(names) :] + names[: r % len(names)]:
                results[name].append(asyncio.run(run_http(live[name], 1, tokens, sampling)))
    return results


def report(
    results: dict[str, list[Result]],
    sizes: dict[str, dict[str, int]],
    bandwidth: float,
    args: argparse.Namespace,
) -> None:
    print(
        f"\nread bandwidth {bandwidth / 1e9:.1f} GB/s (sum of {args.mb} MiB, "
        f"{torch.get_num_threads()} threads, best of 14)"
    )
    print(f"one stream, medians of {args.rounds} interleaved rounds:")
    head = f"{'server':<18} {'tok/s':>7} {'decode':>7} {'TTFT ms':>8} {'MiB/tok':>8} {'limit':>7}"
    print(f"{head} {'fraction':>8}")
    medians: dict[str, float] = {}
    for name, runs in results.items():
        if not runs or not any(r.tokens for r in runs):
            print(f"{name:<18} did not start or answered nothing")
            continue
        rate = _median([r.rate for r in runs])
        decode = _median([decode_rate(r) for r in runs])
        # the first token's share of tok/s: ours against a prompt cache's on a resent prompt
        ttft = _median([r.ttft[0] * 1000 for r in runs if r.ttft])
        per_token = sum(sizes[name].values())
        limit = bandwidth / per_token
        medians[name] = rate
        print(
            f"{name:<18} {rate:>7.1f} {decode:>7.1f} {ttft:>8.0f} {per_token / MB:>8.2f} "
            f"{limit:>7.0f} {decode / limit:>8.2f}"
        )
    for name in medians:
        if name.startswith("ours") and "llama-cpp-python" in medians:
            print(f"{name} / llama-cpp-python: {medians[name] / medians['llama-cpp-python']:.2f}x")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


if __name__ == "__main__":
    main()
