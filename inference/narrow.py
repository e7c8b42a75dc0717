"""Fewer padded rows for a prefill's small pieces, where this CPU gives them the same bits.

A prefill's rows go through the linear layers in calls of quant.TILE (128) rows and through
attention in tiles of prefill_attention.TILE (64) query positions, zero padded, because a
kernel may sum in another order for another row count (oneDNN's bfloat16 kernels on AMX
do), and a prompt's KV must not depend on how it was chunked. A next turn's ~30 new tokens
then pay 4x their rows in every linear layer and 2x in attention, deep in a long conversation.

Whether a smaller call gives each row the bits of the full one is a property of the kernels
of this CPU, at this thread count, for this shape: not something to assume. So each shape is
tried once, on random rows: the full call against calls of fewer rows taken from everywhere
in it (for attention tens of milliseconds, up to ~250 deep in a long prompt, once per depth
of 256 positions per process; hf_prefill probes every depth while the server is idle after
it starts, else the first prefill to meet a shape pays for it). A smaller call is used only
where every row came out bit for bit the same (and the call was faster); everywhere else the
full tile, as before. Which count a call uses then changes only its speed, never a bit of a
prompt's KV.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator

import torch

from inference import onednn

STEP = 16  # narrow linear calls are multiples of this many rows, or SMALL_WIDTHS
# narrow calls of fewer than STEP rows: where this CPU computes each row on its own, a lone
# next turn's head needs 1 row, not 16 (49,152 x 576 in bfloat16 on an AVX2 Zen 3, whose
# bfloat16 is emulated: 58 ms for 16 rows, 5 ms for 1, the same bits), and a prompt's one
# new token (a resent prompt) goes through each layer as 1 row (the layers' float32 packed
# calls on that Zen 3: 1 row 70-157 us, 16 rows 133-318 us, the same bits as 128 rows)
# 12: a next turn's question and the assistant's opening, past the markup cached with the
# reply before it (hf_prefill.Prefiller.finished): 11 rows in bench.long_context, 16 before
SMALL_WIDTHS = (1, 2, 4, 8, 12)
# narrow attention calls, in query rows per head: the cost of torch's CPU flash attention
# rises in steps of its row count (against 4,096 keys in bfloat16 on a Zen 5: 0.8-0.9 ms at
# 8 rows per head, 1.3 at 16, 2.1-2.4 at 24-32), so 8 rows fewer can be a step less. In one
# process, alternating, next turns deep in a ~4,100-token conversation took 1-17% less
# (medians of pairs) with these than with multiples of 16 (bench/README.md)
ATTENTION_STEP = 8
# and up to FINE_WIDTH rows per head, multiples of FINE_STEP starting at any multiple of it:
# a next turn's 11 rows at offsets 39-49 of their tile took 16 rows (36-52) instead of 24
# (32-56), 2.2 instead of 2.6 ms a layer against 3,840 keys on a Zen 3 (bench/README.md);
# the probe checks these at every multiple of FINE_STEP, the larger ones of ATTENTION_STEP
FINE_STEP = 4
FINE_WIDTH = 16
enabled = True  # tests turn it off to compare; nothing else does
_linear: dict[tuple, tuple[int, ...]] = {}
_attention: dict[tuple, tuple[int, ...]] = {}
# attention probes begun in the server's idle time (attention_probe_for), by their keys
_pending: dict[tuple, Generator[None, None, tuple[int, ...]]] = {}
_lock = threading.Lock()


def linear_rows(
    rows: int, weight: torch.Tensor, bias: torch.Tensor | None, tile: int, packed: bool = False
) -> int:
    """How many rows (`rows` and zero padding) a prefill's last call through `weight` takes
    (`packed`: in oneDNN's layout, inference/onednn.py)."""
    key = (
        tuple(weight.shape),
        weight.dtype,
        bias is not None,
        tile,
        packed,
        torch.get_num_threads(),
    )
    widths = _cached(_linear, key, lambda: _probe_linear(weight, bias, tile, packed))
    return next((w for w in widths if w >= rows), tile)


def attention_widths(key: tuple, prober: Callable[[], Callable]) -> tuple[int, ...]:
    """Query rows per head (multiples of ATTENTION_STEP below a tile, and of FINE_STEP up
    to FINE_WIDTH, each checked at every start on its own grid) an attention call of
    shape `key` may take instead of its whole tile (key[0] rows). `prober()`, called once per
    key, makes the probe's call: `attend(r0, r1)` on the tile's rows [r0, r1), returning its
    outputs with the rows along their first axis."""
    full = (*key, torch.get_num_threads())
    return _cached(_attention, full, lambda: _finish(_attention_steps(full, prober)))


def attention_probe_for(key: tuple, prober: Callable[[], Callable], seconds: float) -> bool:
    """Advances the probe of attention_widths(key, prober) by about `seconds` of its calls
    (at least one); whether it is done. The server probes in its idle time this way, a slice
    at a time: a whole probe deep in a long prompt took up to 250 ms, and a request that
    arrived in the seconds after the server started waited for all of it."""
    if not enabled:
        return True
    full = (*key, torch.get_num_threads())
    with _lock:
        if full in _attention:
            return True
        steps = _attention_steps(full, prober)
        deadline = time.perf_counter() + seconds
        try:
            next(steps)
            while time.perf_counter() < deadline:
                next(steps)
        except StopIteration as done:
            _attention[full] = done.value
            return True
        _pending[full] = steps
        return False


def _attention_steps(
    full: tuple, prober: Callable[[], Callable]
) -> Generator[None, None, tuple[int, ...]]:
    """The probe of `full` where it was begun (taken over from _pending), else a new one."""
    begun = _pending.pop(full, None)
    if begun is not None:
        return begun
    tile = full[0]
    fine = range(FINE_STEP, min(FINE_WIDTH + 1, tile), FINE_STEP)
    widths = sorted({*fine, *range(ATTENTION_STEP, tile, ATTENTION_STEP)})
    strides = {w: attention_stride(w) for w in widths}
    return _probe_steps(prober(), tile, ATTENTION_STEP, tuple(widths), strides)


def attention_stride(width: int) -> int:
    """The grid an attention call of `width` query rows per head starts on (and is probed
    at every start of)."""
    return FINE_STEP if width <= FINE_WIDTH else ATTENTION_STEP


def _finish(steps: Generator[None, None, tuple[int, ...]]) -> tuple[int, ...]:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


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


def _probe_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, tile: int, packed: bool
) -> tuple[int, ...]:
    if weight.device.type != "cpu":
        return ()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tile, weight.shape[1], generator=gen).to(weight.dtype)

    def call(r0: int, r1: int) -> tuple[torch.Tensor, ...]:
        return (onednn.linear(x[r0:r1].clone(), weight, bias, packed),)

    small = tuple(w for w in SMALL_WIDTHS if w < min(tile, STEP))
    if tile <= STEP:
        return _probe(call, tile, 1, small)
    return _probe(call, tile, STEP, small + tuple(range(STEP, tile, STEP)))


def _probe(
    call: Callable[[int, int], tuple[torch.Tensor, ...]],
    tile: int,
    step: int,
    candidates: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    return _finish(_probe_steps(call, tile, step, candidates))


def _probe_steps(
    call: Callable[[int, int], tuple[torch.Tensor, ...]],
    tile: int,
    step: int,
    candidates: tuple[int, ...] | None = None,
    strides: dict[int, int] | None = None,
) -> Generator[None, None, tuple[int, ...]]:
    """The widths (`candidates`, else the multiples of `step`) that took less time than the
    full call (best of two, at the tile's start) and gave exactly its rows wherever in the
    tile they started (at multiples of `strides[width]`, else of `step`, or of a width
    below STEP itself). A width
    that is not faster is not checked: the probe runs inside a prefill step when the server
    was not idle before it. Yields after each call, a point where it may pause."""
    full, full_time = _timed(call, 0, tile)
    yield

    def same(r0: int, width: int, outs: tuple[torch.Tensor, ...]) -> bool:
        return all(
            torch.equal(part, whole[r0 : r0 + width])
            for part, whole in zip(outs, full, strict=True)
        )

    widths = []
    for width in candidates or range(step, tile, step):
        outs, spent = _timed(call, 0, width)
        yield
        if spent < full_time and same(0, width, outs):
            stride = strides[width] if strides else width if width < STEP else step
            kept = True
            for r0 in range(stride, tile - width + 1, stride):
                kept = same(r0, width, call(r0, r0 + width))
                yield
                if not kept:
                    break
            if kept:
                widths.append(width)
    return tuple(widths)


def _timed(call: Callable, r0: int, r1: int) -> tuple[tuple[torch.Tensor, ...], float]:
    best, outs = float("inf"), ()
    for _ in range(2):
        start = time.perf_counter()
        outs = call(r0, r1)
        best = min(best, time.perf_counter() - start)
    return outs, best
