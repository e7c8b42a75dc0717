"""One query's attention in a decode step: the native kernel (inference/attend1.c) against the
same arithmetic as torch calls, alone and in the bundled model's decode step; with `--switch
norm` or `--switch rotary`, the same for the RMS norm (inference/rmsnorm.c against
transformers' calls) or the rotary embedding (inference/rotary.c).

    .venv/bin/python -m bench.attention [--rows 1,4] [--keys 100,400,1000,4000] [--context 0,1500]
    .venv/bin/python -m bench.attention --switch norm   (or rotary)

First `one_query` (or `rms_norm`, `rotate`) on random bfloat16 tensors of the bundled model's
shape (9 query heads over 3 key heads of 64; rows 576 wide), each way in turn, the best of interleaved
batches; then decode tokens/s of the model's lean step (our backend's decode calls, no
scheduler, no HTTP) with that native kernel on and off in alternate rounds (medians), for
prompts padded to `--context` extra tokens. Both print the ratio of times, native over torch
calls. bench/README.md keeps the figures.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.decode_rows import decode_rate
from inference import attention, q4mm, quant, rmsnorm, rotary
from inference.hf_engine import TransformersBackend, eos_ids
from inference.model_store import prepare_model
from inference.settings import Settings

HEADS, KV_HEADS, DIM = 9, 3, 64
SENTENCE = "The keeper climbed the stairs of the lighthouse once more that night. "
# the native parts compared, by --switch: modules whose _native_on is switched
SWITCHES = {"attention": attention, "norm": rmsnorm, "rotary": rotary}
WIDTH = 576  # the bundled model's hidden size


def best_each_way(
    module: Any, call: Callable[[], Any], calls: int, batches: int
) -> dict[bool, float]:
    """Seconds per call() with `module`'s native part on (True) and off (False): the best of
    `batches` interleaved batches of `calls` calls each; the native part is left on."""
    best = {True: float("inf"), False: float("inf")}
    for _ in range(batches):
        for native in best:
            module._native_on = native
            start = time.perf_counter()
            for _ in range(calls):
                call()
            best[native] = min(best[native], (time.perf_counter() - start) / calls)
    module._native_on = True
    return best


def kernel_figures(rows: list[int], keys: list[int], batches: int) -> None:
    print(f"one_query, {torch.get_num_threads()} threads, best of {batches} interleaved batches")
    print(f"{'rows':>4} {'keys':>6} {'native us':>10} {'torch us':>9} {'ratio':>6}", flush=True)
    for b in rows:
        for t in keys:
            q = torch.randn(b, HEADS, 1, DIM).to(torch.bfloat16)
            # keys and values as a cache holds them: views into buffers with room to grow
            k = torch.randn(b, KV_HEADS, t + 64, DIM).to(torch.bfloat16)[:, :, :t]
            v = torch.randn(b, KV_HEADS, t + 64, DIM).to(torch.bfloat16)[:, :, :t]
            mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
            call = functools.partial(attention.one_query, q, k, v, mask, 0.125)
            best = best_each_way(attention, call, max(5, 20_000 // t), batches)
            ratio = best[True] / best[False]
            print(
                f"{b:>4} {t:>6} {best[True] * 1e6:>10.0f} {best[False] * 1e6:>9.0f} {ratio:>6.2f}",
                flush=True,
            )


def small_call(switch: str, rows: int) -> Callable[[], torch.Tensor]:
    """One call of the model's shape: a norm of `rows` rows 576 wide, or the rotation of q
    and k (12 heads of 64) of `rows` rows."""
    if switch == "norm":
        x, w = torch.randn(rows, 1, WIDTH).to(torch.bfloat16), torch.randn(WIDTH).to(torch.bfloat16)
        return lambda: rmsnorm.rms_norm(x, w, 1e-5)
    fused = torch.randn(rows, 1, HEADS + 2 * KV_HEADS, DIM).to(torch.bfloat16).transpose(1, 2)
    qk = fused[:, : HEADS + KV_HEADS]
    cos, sin = (torch.randn(rows, 1, 1, DIM).to(torch.bfloat16) for _ in range(2))
    return lambda: rotary.rotate(qk, cos, sin)


def call_figures(rows: list[int], batches: int, switch: str) -> None:
    print(f"{switch}, {torch.get_num_threads()} threads, best of {batches} interleaved batches")
    print(f"{'rows':>4} {'native us':>10} {'torch us':>9} {'ratio':>6}", flush=True)
    for b in rows:
        best = best_each_way(SWITCHES[switch], small_call(switch, b), 2000, batches)
        ratio = best[True] / best[False]
        print(f"{b:>4} {best[True] * 1e6:>10.1f} {best[False] * 1e6:>9.1f} {ratio:>6.2f}")


def step_figures(
    rows: list[int], contexts: list[int], tokens: int, rounds: int, switch: str = "attention"
) -> None:
    loaded = prepare_model(Settings(model="", dtype="int4", device="cpu"))
    backend = TransformersBackend(loaded.model, eos_ids(loaded.model, loaded.tokenizer))
    if backend.fast is None:
        print("the lean decode step does not serve this model: no step figures")
        return
    module = SWITCHES[switch]
    print(f"\ndecode tokens/s, lean step, {tokens} tokens, medians of {rounds} alternate rounds")
    print(f"native {switch} on and off")
    print(f"{'streams':>7} {'+prompt':>8} {'native':>8} {'torch':>8} {'ratio':>6}")
    per_sentence = len(loaded.tokenizer(SENTENCE).input_ids)
    for b in rows:
        for extra in contexts:
            filler = SENTENCE * (extra // per_sentence)
            rates: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(rounds):
                for native in rates:
                    module._native_on = native
                    rate = decode_rate(
                        loaded, backend, b, tokens, quant.FEW_ROWS, backend.fast, filler
                    )
                    rates[native].append(rate)
            module._native_on = True
            on, off = statistics.median(rates[True]), statistics.median(rates[False])
            added = per_sentence * (extra // per_sentence)
            # ratio: the step's time with the native kernel over its time with torch's calls
            print(f"{b:>7} {added:>8} {on:>8.1f} {off:>8.1f} {off / on:>6.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,4", help="rows (streams) per call, comma-separated")
    parser.add_argument("--keys", default="100,400,1000,4000", help="keys per row, kernel alone")
    parser.add_argument("--context", default="0,1500", help="extra prompt tokens, decode step")
    parser.add_argument("--tokens", type=int, default=48, help="decode steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternate rounds of the step")
    parser.add_argument("--batches", type=int, default=11, help="batches per kernel figure")
    parser.add_argument(
        "--switch", choices=sorted(SWITCHES), default="attention", help="the native part compared"
    )
    args = parser.parse_args()
    if not q4mm.available():
        raise SystemExit("the native kernels cannot be built here: nothing to compare")
    rows = [int(x) for x in args.rows.split(",")]
    if args.switch != "attention":
        call_figures(rows, args.batches, args.switch)
    else:
        kernel_figures(rows, [int(x) for x in args.keys.split(",")], args.batches)
    contexts = [int(x) for x in args.context.split(",")]
    step_figures(rows, contexts, args.tokens, args.rounds, args.switch)


if __name__ == "__main__":
    main()
