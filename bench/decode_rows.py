"""Where DTYPE=int4's 4-bit kernel stops paying: decode tokens/s by batch size, through the
4-bit kernel vs the same layers' bfloat16 weights (inference/quant.py's FEW_ROWS), and what
the lean decode step (inference/decode_step.py) adds over transformers' forward.

    .venv/bin/python -m bench.decode_rows --batches 1,2,4,8,12,16 [--threads 1]

Runs our backend's prefill + decode steps directly (no scheduler thread, no HTTP); the
paths alternate, and each figure is the median of --rounds runs. bench/README.md keeps the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import inference.quant as quant
from bench.measure import PROMPTS
from inference.chat_encoder import encode_chat
from inference.engine import Message
from inference.hf_engine import TransformersBackend, eos_ids
from inference.model_store import LoadedModel, prepare_model
from inference.sampling_params import SamplingParams
from inference.scheduler import Sequence
from inference.settings import Settings
from inference.textstream import IncrementalDetokenizer


def decode_rate(
    loaded: LoadedModel,
    backend: TransformersBackend,
    batch: int,
    tokens: int,
    few_rows: int,
    lean: Any = None,
    filler: str = "",
) -> float:
    """`lean`: the backend's DecodeStep, or None for transformers' forward; `filler`: text put
    before each prompt (a longer context)."""
    quant.FEW_ROWS = few_rows
    backend.fast = lean
    seqs = [
        Sequence(
            encode_chat(loaded.tokenizer, [Message("user", filler + PROMPTS[i % len(PROMPTS)])]),
            SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True),
            IncrementalDetokenizer(loaded.tokenizer),
            asyncio.Queue(),
        )
        for i in range(batch)
    ]
    for seq, tok in zip(seqs, backend.prefill(seqs)):
        seq.generated.append(tok.token)
    start = time.perf_counter()
    for _ in range(tokens - 1):
        for seq, tok in zip(seqs, backend.decode(seqs)):
            seq.generated.append(tok.token)
    backend.release(seqs)
    return batch * (tokens - 1) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batches", default="1,2,4,8,12,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    args = ap.parse_args()
    loaded = prepare_model(Settings(model="", dtype="int4", device="cpu", threads=args.threads))
    backend = TransformersBackend(loaded.model, eos_ids(loaded.model, loaded.tokenizer))
    lean = backend.fast
    print(f"{'batch':>5} {'bf16 weights':>13} {'4-bit kernel':>13} {'+ lean step':>12}", end="")
    print("   (decode tokens/s, medians)")
    for batch in (int(b) for b in args.batches.split(",")):
        decode_rate(loaded, backend, batch, 8, batch, lean)  # warm-up
        runs: dict[str, list[float]] = {"dense": [], "int4": [], "lean": []}
        for _ in range(args.rounds):
            runs["dense"].append(decode_rate(loaded, backend, batch, args.tokens, 0))
            runs["int4"].append(decode_rate(loaded, backend, batch, args.tokens, batch))
            runs["lean"].append(decode_rate(loaded, backend, batch, args.tokens, batch, lean))
        dense, int4, fast = (sorted(r)[len(r) // 2] for r in runs.values())
        print(f"{batch:>5} {dense:>13.1f} {int4:>13.1f} {fast:>12.1f}", flush=True)


if __name__ == "__main__":
    main()
