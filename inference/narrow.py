"""Fewer padded rows for a prefill's small pieces, where this CPU gives them the same bits.

A prefill's rows go through the linear layers in calls of quant.TILE (128) rows and through
attention in tiles of prefill_attention.TILE (64) query positions, zero padded, because a
kernel may sum in another order for another row count (oneDNN's bfloat16 kernels on AMX
do), and a prompt's KV must not depend on how it was chunked. A next turn's ~30 new tokens
then pay 4x their rows in every linear layer and 2x in attention, deep in a long conversation.

Whether a smaller call gives each row the bits of the full one is a property of the kernels
of this CPU, at this thread count, for this shape: not something to assume. So each shape is
tried once, on random rows: the full call against calls of fewer rows taken from everywhere
in it (a few tens of milliseconds for attention deep in a long prompt, once per depth of 256
positions per process; hf_prefill probes every depth while the server is idle after it
starts, else the first prefill to meet a shape pays for it). A smaller call is used only
where every row came out bit for bit the same (and the call was faster); everywhere else the
full tile, as before. Which count a call uses then changes only its speed, never a bit of a
prompt's KV.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F

STEP = 16  # narrow calls are multiples of this many rows (prefill.MIN_ROWS)
enabled = True  # tests turn it off to compare; nothing else does
_linear: dict[tuple, tuple[int, ...]] = {}
_attention: dict[tuple, tuple[int, ...]] = {}
_lock = threading.Lock()


def linear_rows(rows: int, weight: torch.Tensor, bias: torch.Tensor | None, tile: int) -> int:
    """How many rows (`rows` and zero padding) a prefill's last call through `weight` takes."""
    key = (tuple(weight.shape), weight.dtype, bias is not None, tile, torch.get_num_threads())
    widths = _cached(_linear, key, lambda: _probe_linear(weight, bias, tile))
    return next((w for w in widths if w >= rows), tile)


def attention_widths(key: tuple, prober: Callable[[], Callable]) -> tuple[int, ...]:
    """Query rows per head (multiples of STEP below a tile) an attention call of shape `key`
    may take instead of its whole tile (key[0] rows). `prober()`, called once per key, makes
    the probe's call: `attend(r0, r1)` on the tile's rows [r0, r1), returning its outputs
    with the rows along their first axis."""
    return _cached(_attention, (*key, torch.get_num_threads()), lambda: _probe(prober(), key[0]))


def _cached(cache: dict, key: tuple, probe: Callable[[], tuple[int, ...]]) -> tuple[int, ...]:
    if not enabled:
        return ()
    found = cache.get(key)
    if found is None:
        with _lock:
            found = cache.get(key)
            if found is None:
                found = cache[key] = probe()
    return found


def _probe_linear(weight: torch.Tensor, bias: torch.Tensor | None, tile: int) -> tuple[int, ...]:
    if weight.device.type != "cpu":
        return ()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tile, weight.shape[1], generator=gen).to(weight.dtype)

    def call(r0: int, r1: int) -> tuple[torch.Tensor, ...]:
        return (F.linear(x[r0:r1].clone(), weight, bias),)

    return _probe(call, tile)


def _probe(call: Callable[[int, int], tuple[torch.Tensor, ...]], tile: int) -> tuple[int, ...]:
    """The widths whose calls gave exactly the full call's rows wherever in the tile they
    started (at multiples of STEP), and took less time than it (best of two)."""
    full, full_time = _timed(call, 0, tile)
    widths = []
    for width in range(STEP, tile, STEP):
        same, spent = True, 0.0
        for r0 in range(0, tile - width + 1, STEP):
            outs, spent_here = _timed(call, r0, r0 + width)
            spent = max(spent, spent_here)
            same = same and all(
                torch.equal(part, whole[r0 : r0 + width])
                for part, whole in zip(outs, full, strict=True)
            )
        if same and spent < full_time:
            widths.append(width)
    return tuple(widths)


def _timed(call: Callable, r0: int, r1: int) -> tuple[tuple[torch.Tensor, ...], float]:
    best, outs = float("inf"), ()
    for _ in range(2):
        start = time.perf_counter()
        outs = call(r0, r1)
        best = min(best, time.perf_counter() - start)
    return outs, best
