"""Prefill attention whose KV is bit for bit the KV of one whole pass.

A prompt may be prefilled whole, in chunks between decode steps, or on top of a cached prefix;
greedy replies must not depend on which. torch's own attention kernels do not give that: a
query's result depends on how many queries and keys share the call (the kernel blocks them
differently), so a chunked prompt drifts from the unchunked one after a few hundred tokens.
The linear layers, norms and activations already give each row the same bits whatever the
number of rows (quant.invariant_linear; tests/inference/test_quant.py checks it), so only
attention is replaced:

- Keys are grouped in fixed blocks of ATTN_BLOCK positions, counted from the prompt's start. A
  query in block j attends keys [0, j*ATTN_BLOCK) in one unmasked call and its own block
  [j*ATTN_BLOCK, (j+1)*ATTN_BLOCK) in one masked call (keys not computed yet are zeros and
  masked), then the two are merged by their log-sum-exp. Every call's keys depend on the query's
  position alone, never on the chunk it came in.
- Queries go in as tiles of TILE positions, also counted from the prompt's start, one batch
  entry per tile (zero rows where the piece does not cover the tile): the kernel sees a query
  in the same row of a same-shaped entry whatever the piece, since with fewer rows it may take
  other code paths with other rounding. Where this CPU was seen to give a tile's rows the same
  bits in a call of fewer of them (inference/narrow.py), a piece that covers part of a tile
  takes only its own rows of it.
- exp() takes a different code path for the last few elements of a tensor, so the merge weights
  are computed on a fixed block-sized layout where each tile sits at its place in the block.
- The sequences of one prefill step are packed into one row for the linear layers (one forward
  pass however many sequences), and each attends only to its own KV, so a sequence's KV does
  not depend on what it was prefilled with either.

The attention function takes over transformers' "sdpa" entry: a PrefillPlan passed in the
forward's kwargs attends as above, one query per row on CPU (a decode step) goes to
inference/attention.py, and every other call (other users of the model) to sdpa as is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from inference import narrow
from inference.attention import handles as one_query_handles
from inference.attention import one_query
from inference.attention import pays as attention_pays

if TYPE_CHECKING:
    from inference.prefill import Piece

ATTN_BLOCK = 256
# queries per attention call entry (a multiple of it divides ATTN_BLOCK). torch's CPU flash
# attention blocks an entry's rows by how many there are: with 32 (x3 query heads: 96 rows) it
# took 1.75x as long per query as with 64 (192 rows) against 3,584 keys (1 thread, measured)
TILE = 64
_registered = False


@dataclass
class PrefillPlan:
    pieces: list[Piece]
    kv_heads: int
    dtype: torch.dtype | None = None  # what attention computes in (None: the queries' own)
    _mask: torch.Tensor | None = None

    def attend(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """query [1, H, T, D], key/value [1, kv_heads, T, D] of the packed row -> [1, T, H, D]."""
        out = query.new_zeros((1, query.shape[2], query.shape[1], query.shape[3]))
        for p in self.pieces:
            kv = p.job.kv[layer]
            kv[0, :, p.start : p.start + p.length] = key[0, :, p.offset : p.offset + p.length]
            kv[1, :, p.start : p.start + p.length] = value[0, :, p.offset : p.offset + p.length]
            for j in range(p.start // ATTN_BLOCK, (p.start + p.length - 1) // ATTN_BLOCK + 1):
                lo = max(p.start, j * ATTN_BLOCK)
                hi = min(p.start + p.length, (j + 1) * ATTN_BLOCK)
                rows = slice(p.offset + lo - p.start, p.offset + hi - p.start)
                out[0, rows] = self._block(kv, query[0, :, rows], j, lo, scale).transpose(0, 1)
        return out

    def _block(
        self, kv: torch.Tensor, q: torch.Tensor, j: int, lo: int, scale: float
    ) -> torch.Tensor:
        """Queries q [H, n, D] at positions [lo, lo + n) of key block j -> [H, n, D]."""
        s = j * ATTN_BLOCK
        dtype = self.dtype or q.dtype
        q = q.to(dtype)
        # only the keys this block's queries can see, converted once for every call below
        keys = kv[0][None, :, : s + ATTN_BLOCK].to(dtype)
        values = kv[1][None, :, : s + ATTN_BLOCK].to(dtype)
        parts = [
            self._tiles(q[:, a - lo : b - lo], keys, values, j, a, scale, rows)
            for a, b, rows in self._segments(q, j, lo)
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def _segments(
        self, q: torch.Tensor, j: int, lo: int
    ) -> list[tuple[int, int, tuple[int, int] | None]]:
        """[lo, lo + n) as (start, end, rows): the tiles it covers whole in one piece (rows
        None), and a tile it covers in part alone, with the rows of it that call may take
        (inference/narrow.py) where they are fewer than the tile's."""
        n, s = q.shape[1], j * ATTN_BLOCK
        hi = lo + n
        if (lo - s) % TILE == 0 and n % TILE == 0:
            return [(lo, hi, None)]
        widths = self._widths(q, j)
        if not widths:
            return [(lo, hi, None)]
        edges = sorted({lo, hi, *range(lo - (lo - s) % TILE + TILE, hi, TILE)})
        out: list[tuple[int, int, tuple[int, int] | None]] = []
        for a, b in zip(edges, edges[1:], strict=False):
            rows = _narrow_rows((a - s) % TILE, (b - s - 1) % TILE + 1, widths)
            if rows is None and out and out[-1][2] is None:
                out[-1] = (out[-1][0], b, None)  # whole tiles together, one call
            else:
                out.append((a, b, rows))
        return out

    def prime(self, like: torch.Tensor, j: int, seconds: float) -> bool:
        """Probes for about `seconds` (narrow.attention_probe_for) the narrow widths
        (inference/narrow.py) that queries `like` [H, n, D] (their dtype and device; n may be
        0) will ask for in key block j; whether they are all probed."""
        if like.device.type != "cpu":
            return True
        group = like.shape[0] // self.kv_heads
        own = self._probe(group, like.shape[2], ATTN_BLOCK, True, like)
        if not narrow.attention_probe_for(*own, seconds):
            return False
        if j == 0 or not narrow.attention_widths(*own):
            return True  # no past keys, or no width to check against them (_widths)
        past = self._probe(group, like.shape[2], j * ATTN_BLOCK, False, like)
        return narrow.attention_probe_for(*past, seconds)

    def _widths(self, q: torch.Tensor, j: int) -> tuple[int, ...]:
        """Row widths below a tile that both of block j's calls give the same bits at."""
        group = q.shape[0] // self.kv_heads
        own = self._probe_widths(group, q.shape[2], ATTN_BLOCK, True, q)
        if not own or j == 0:
            return own
        past = self._probe_widths(group, q.shape[2], j * ATTN_BLOCK, False, q)
        return tuple(w for w in own if w in past)

    def _probe_widths(
        self, group: int, dim: int, keys: int, masked: bool, like: torch.Tensor
    ) -> tuple[int, ...]:
        if like.device.type != "cpu":
            return ()
        return narrow.attention_widths(*self._probe(group, dim, keys, masked, like))

    def _probe(
        self, group: int, dim: int, keys: int, masked: bool, like: torch.Tensor
    ) -> tuple[tuple, Callable[[], Callable]]:
        """The key of a probe of narrow calls against `keys` keys, and its prober."""

        def prober() -> Any:
            gen = torch.Generator().manual_seed(0)
            q, k, v = (
                torch.randn((1, self.kv_heads, rows, dim), generator=gen).to(like.dtype)
                for rows in (group * TILE, keys, keys)
            )
            mask = self._tile_mask(group, like.dtype, like.device)[:1] if masked else None

            def call(r0: int, r1: int) -> tuple[torch.Tensor, ...]:
                out, lse = _attend_rows(q, k, v, mask, 0.125, (r0, r1), group, scatter=False)
                return out.movedim(3, 0), lse.movedim(3, 0)

            return call

        return (TILE, self.kv_heads, group, dim, keys, masked, like.dtype), prober

    def _tiles(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        j: int,
        lo: int,
        scale: float,
        rows: tuple[int, int] | None,
    ) -> torch.Tensor:
        """_block's work for the queries q [H, n, D] at [lo, lo + n), in whole tiles."""
        heads, n, dim = q.shape
        group = heads // self.kv_heads
        s = j * ATTN_BLOCK
        first, last = (lo - s) // TILE, (lo + n - 1 - s) // TILE + 1
        at = lo - s - first * TILE
        if at or n % TILE:
            tiles = q.new_zeros((heads, (last - first) * TILE, dim))
            tiles[:, at : at + n] = q
        else:
            tiles = q
        # one batch entry per tile, a kv head's query heads side by side: every call has the
        # same shape whatever the piece, and a query always the same row in it
        tiles = tiles.reshape(self.kv_heads, group, -1, TILE, dim).permute(2, 0, 1, 3, 4)
        tiles = tiles.reshape(-1, self.kv_heads, group * TILE, dim)
        nt = tiles.shape[0]
        mask = self._tile_mask(group, q.dtype, q.device)[first:last]
        own, own_lse = _attend_rows(
            tiles,
            _tiled(keys, s, s + ATTN_BLOCK, nt),
            _tiled(values, s, s + ATTN_BLOCK, nt),
            mask,
            scale,
            rows,
            group,
        )
        if j > 0:
            past, past_lse = _attend_rows(
                tiles, _tiled(keys, 0, s, nt), _tiled(values, 0, s, nt), None, scale, rows, group
            )
            own = _merge(past, past_lse, own, own_lse, first)
        own = (
            own.reshape(-1, self.kv_heads, group, TILE, dim)
            .permute(1, 2, 0, 3, 4)
            .reshape(heads, -1, dim)
        )
        return own[:, at : at + n]

    def _tile_mask(self, group: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Additive mask [tiles per block, 1, group * TILE, ATTN_BLOCK]: a query sees the keys
        of its block up to its own position (later ones may not be computed yet: zeros)."""
        if self._mask is None:
            pos = torch.arange(ATTN_BLOCK, device=device).reshape(-1, 1, 1, TILE, 1)
            later = torch.arange(ATTN_BLOCK, device=device).reshape(1, 1, 1, 1, -1) > pos
            later = later.expand(-1, 1, group, -1, -1).reshape(-1, 1, group * TILE, ATTN_BLOCK)
            self._mask = torch.zeros(later.shape, dtype=dtype, device=device).masked_fill(
                later, float("-inf")
            )
        return self._mask


def _narrow_rows(r0: int, r1: int, widths: tuple[int, ...]) -> tuple[int, int] | None:
    """The rows of a tile a call takes to cover its rows [r0, r1): the fewest of `widths`
    (ascending) that covers them starting on its own grid (narrow.attention_stride); None:
    the whole tile."""
    for width in widths:
        grid = narrow.attention_stride(width)
        start = r0 // grid * grid
        if -(-r1 // grid) * grid - start <= width:
            start = min(start, TILE - width)
            return start, start + width
    return None


def _tiled(t: torch.Tensor, start: int, end: int, tiles: int) -> torch.Tensor:
    return t[:, :, start:end].expand(tiles, -1, -1, -1)


def _attend_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    rows: tuple[int, int] | None,
    group: int,
    scatter: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """_attend on tiles [b, kv_heads, group * TILE, D], or on their rows [r0, r1) of each tile
    alone, put back in place among zeros (scatter) or returned as [b, kv_heads, group, r1 - r0, D]
    and [b, kv_heads, group, r1 - r0]."""
    if rows is None:
        return _attend(q, k, v, mask, scale)
    r0, r1 = rows

    def cut(t: torch.Tensor) -> torch.Tensor:
        b, h, _, d = t.shape
        return t.reshape(b, h, group, TILE, d)[:, :, :, r0:r1].reshape(b, h, -1, d)

    out, lse = _attend(cut(q), k, v, None if mask is None else cut(mask), scale)
    b, h, _, d = q.shape
    out, lse = out.reshape(b, h, group, r1 - r0, d), lse.reshape(b, h, group, r1 - r0)
    if not scatter:
        return out, lse
    full_out = out.new_zeros((b, h, group, TILE, d))
    full_lse = lse.new_zeros((b, h, group, TILE))
    full_out[:, :, :, r0:r1] = out
    full_lse[:, :, :, r0:r1] = lse
    return full_out.reshape(q.shape), full_lse.reshape(q.shape[:-1])


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output [b, h, n, D] and its log-sum-exp [b, h, n] (float32)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale
        )
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, -1)
    return (torch.exp(scores - lse[..., None]) @ v.float()).to(q.dtype), lse


def _merge(
    past: torch.Tensor, past_lse: torch.Tensor, own: torch.Tensor, own_lse: torch.Tensor, first: int
) -> torch.Tensor:
    """Softmax-weighted sum of two partial attentions over disjoint keys (tiles first..)."""
    nt = past_lse.shape[0]
    # exp() over the whole block's tiles, each at its own place: the same code path for a
    # query however many tiles came with it
    block = past_lse.new_zeros((2, ATTN_BLOCK // TILE, *past_lse.shape[1:]))
    top = torch.maximum(past_lse, own_lse)
    block[0, first : first + nt] = past_lse - top
    block[1, first : first + nt] = own_lse - top
    w = torch.exp(block)[:, first : first + nt, ..., None]
    w = w / (w[0] + w[1])
    return torch.addcmul(past * w[0], own, w[1]).to(own.dtype)


def attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    plan: PrefillPlan | None = kwargs.get("prefill_plan")
    if plan is None and one_query_handles(query, kwargs) and attention_pays():
        scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
        return one_query(query, key, value, attention_mask, scale), None
    if plan is None:
        return _sdpa(module, query, key, value, attention_mask, *args, **kwargs)
    scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
    return plan.attend(module.layer_idx, query, key, value, scale), None


def _sdpa(*args: Any, **kwargs: Any) -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def register() -> None:
    """Puts `attention` in transformers' "sdpa" slot; without a plan it is sdpa itself."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register("sdpa", attention)
        _registered = True
