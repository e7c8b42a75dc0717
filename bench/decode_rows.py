"""Where DTYPE=int4's 4-bit kernel stops paying: decode tokens/s by batch size, through the
4-bit kernel vs the same layers' bfloat16 weights (inference/quant.py's FEW_ROWS).

    .venv/bin/python bench/decode_rows.py --batches 1,2,4,8,12,16

Runs our backend's prefill + decode steps directly (no scheduler thread, no HTTP); the two
paths alternate, and each figure is the median of --rounds runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import inference.quant as quant  # noqa: E402
from inference.engine import Message  # noqa: E402
from inference.hf_engine import TransformersBackend, TransformersEngine  # noqa: E402
from inference.model_store import prepare_model  # noqa: E402
from inference.scheduler import SamplingParams, Sequence  # noqa: E402
from inference.settings import Settings  # noqa: E402
from inference.textstream import IncrementalDetokenizer  # noqa: E402

PROMPTS = ["Tell me a story about a lighthouse keeper.", "Explain how rain forms.",
           "Write a poem about the sea.", "Describe a busy market in the morning."]


def decode_rate(engine: TransformersEngine, backend: TransformersBackend, batch: int, tokens: int,
                few_rows: int) -> float:
    quant.FEW_ROWS = few_rows
    seqs = [Sequence(engine._encode([Message("user", PROMPTS[i % len(PROMPTS)])])[0],
                     SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True),
                     IncrementalDetokenizer(engine.tokenizer), asyncio.Queue()) for i in range(batch)]
    for seq, tok in zip(seqs, backend.prefill(seqs)):
        seq.generated.append(tok)
    start = time.perf_counter()
    for _ in range(tokens - 1):
        for seq, tok in zip(seqs, backend.decode(seqs)):
            seq.generated.append(tok)
    backend.release(seqs)
    return batch * (tokens - 1) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,2,4,8,12,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    settings = Settings(model="", dtype="int4", device="cpu")
    engine = TransformersEngine(settings, loaded=prepare_model(settings))
    engine._load()
    backend = engine._backend()
    print(f"{'batch':>5} {'bf16 weights':>13} {'4-bit kernel':>13}   (decode tokens/s, medians)")
    for batch in (int(b) for b in args.batches.split(",")):
        decode_rate(engine, backend, batch, 8, batch)  # warm-up
        runs: dict[str, list[float]] = {"dense": [], "int4": []}
        for _ in range(args.rounds):
            runs["dense"].append(decode_rate(engine, backend, batch, args.tokens, 0))
            runs["int4"].append(decode_rate(engine, backend, batch, args.tokens, batch))
        dense, int4 = (sorted(r)[len(r) // 2] for r in runs.values())
        print(f"{batch:>5} {dense:>13.1f} {int4:>13.1f}", flush=True)


if __name__ == "__main__":
    main()
