"""The same prefill matmuls in two orders: a whole prompt's pass multiplies each weight by all
of its tiles in a row; a chunked prefill takes each chunk's tiles through every layer, so a
weight comes back only after the other layers' (~420 MB of float32 weights for the bundled
model). Prints each order's time, medians of interleaved rounds, as a ratio of the pass.

    .venv/bin/python -m bench.tile_order                 # chunks of 1, 2 and 4 tiles
    .venv/bin/python -m bench.tile_order --chunks 1,8 --rounds 5

Random float32 weights of the bundled model's linear layers (SmolLM2-135M: 30 layers, hidden
576, MLP 1536, 3 KV heads of 64), tiles of quant.TILE rows, as `invariant_linear` calls them.
bench/README.md keeps the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from inference.quant import TILE

HIDDEN, MLP, KV, LAYERS, TILES = 576, 1536, 192, 30, 32
SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN)]  # q, k, v, o
SHAPES += [(MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP)]  # gate, up, down

Weights = list[list[torch.Tensor]]
Multiply = Callable[[torch.Tensor], None]  # one tile through one weight


def orders(weights: Weights, tiles: int, chunk: int) -> list[torch.Tensor]:
    """The weights in the order a prefill in chunks of `chunk` tiles multiplies its tiles by
    them (chunk = tiles: one pass, each weight by every tile in a row)."""
    out = []
    for _ in range(tiles // chunk):
        for layer in weights:
            for w in layer:
                out += [w] * chunk
    return out


def timed(sequence: list[torch.Tensor], multiply: Multiply) -> float:
    start = time.perf_counter()
    for w in sequence:
        multiply(w)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", default="1,2,4", help="tiles per chunk to compare to one pass")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    args = ap.parse_args()
    weights = [[torch.randn(o, i) * 0.02 for o, i in SHAPES] for _ in range(LAYERS)]
    rows = {i: torch.randn(TILE, i) for i in (HIDDEN, MLP)}

    def multiply(w: torch.Tensor) -> None:
        F.linear(rows[w.shape[1]], w)

    modes = {"one pass": TILES} | {f"chunks of {c} tiles": int(c) for c in args.chunks.split(",")}
    times: dict[str, list[float]] = {label: [] for label in modes}
    print(f"{TILES} tiles of {TILE} rows, {LAYERS} layers, {torch.get_num_threads()} threads")
    for _ in range(args.rounds):
        for label, chunk in modes.items():
            times[label].append(timed(orders(weights, TILES, chunk), multiply))
    base = statistics.median(times["one pass"])
    for label, values in times.items():
        print(
            f"{label:>20}: {statistics.median(values):.2f} s, {statistics.median(values) / base:.3f}x"
        )


if __name__ == "__main__":
    main()
