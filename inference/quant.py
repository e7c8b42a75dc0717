"""Weight-only int4 for CPU decode, which is bound by reading the weights.

DTYPE=int4 stores every Linear of the decoder layers as 4-bit integers in groups of 32 along
the input dimension, each group with its own scale and offset: 5 bits per weight. That is
the layout of GGUF's Q4_1 (the bundled model's format), so for that file the int4 weights
are the GGUF's own 4-bit codes (off by under a tenth of a step: the kernel wants the scale
and offset in bfloat16). The LM head (the tied embedding, 21% of SmolLM2's weights, Q8_0
in the GGUF) becomes int8 with one scale per output row. torch's own CPU kernels do the
matmuls (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`) with bfloat16 activations,
so any batch shape works and continuous batching is unaffected.

Those kernels win only for a few rows (`python -m bench.decode_rows` measures where they stop
paying; its figures are in bench/README.md), and a prefill (hundreds of rows) is several
times slower through them. So each layer also keeps its weights in bfloat16 and multiplies
through them when a call has more than FEW_ROWS rows (prefill, big batches): memory is
bfloat16's plus a third (and a oneDNN-packed copy of the LM head, inference/onednn.py), the
speed the better of the two, and a prompt is read exactly as DTYPE=bfloat16 reads it. On a
CPU where oneDNN's bfloat16 is slower than float32 (no AMX), PREFILL_DTYPE=auto keeps those
weights in float32 instead (`faster_dense_dtype`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from inference import narrow, onednn, q4mm, quiet_timing

GROUP = 32
OUT_MULTIPLE = 16  # torch's CPU packing wants output rows in blocks of 16
FEW_ROWS = 8
TILE = 128  # rows per bf16 matmul call in a prefill: see invariant_linear
# rows per LM head call in a prefill, which asks it for one row per prompt ending in the step:
# padded to this, or to fewer rows where this CPU gives each row the same
# bits (inference/narrow.py); in whole tiles of TILE it cost 8x as much (49,152 x 576 in
# bfloat16 without AMX: 375 vs 47 ms)
HEAD_TILE = 16
_dense = threading.local()


def fits(linear: nn.Linear, group: int = GROUP) -> bool:
    return linear.in_features % group == 0 and linear.out_features % OUT_MULTIPLE == 0


class Int4Linear(nn.Module):
    """y = x W^T (+ b) with W in 4-bit groups of GROUP input columns (scale and offset each)."""

    def __init__(self, linear: nn.Linear, group: int = GROUP, kernel: str = "torch") -> None:
        super().__init__()
        out_f, in_f = linear.weight.shape
        if not fits(linear, group):
            raise ValueError(
                f"a {in_f}->{out_f} Linear does not fit the kernel: in_features must be "
                f"a multiple of the group size {group}, out_features of {OUT_MULTIPLE}"
            )
        self.in_features, self.out_features, self.group = in_f, out_f, group
        # one kernel's weights (see choose_kernel): torch's packed codes with bfloat16 scales
        # and offsets, or q4mm's blocks (float16 ones, as in the GGUF)
        native = kernel == "native" and group == q4mm.QK
        packed, scales_zeros = (None, None) if native else _pack_int4(linear.weight, group)
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", scales_zeros)
        blocks = q4mm.interleave(q4mm.pack(linear.weight)) if native else None
        self.register_buffer("blocks", blocks)
        # the original weights, not the 4-bit ones: closer to the source (int4 rounds its
        # scale and offset to bf16), and a prefill through them matches DTYPE=bfloat16 exactly
        self.register_buffer("dense", linear.weight.detach().to(torch.bfloat16))
        self.dense_packed = False  # `dense` in oneDNN's layout (set_dense_dtype packs it)
        bias = linear.bias.detach().to(torch.bfloat16) if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if not _few_rows(x):
            return _many_rows(x, self.dense, self.bias, packed=self.dense_packed)
        flat = x.reshape(-1, self.in_features)
        y = int4_mm(flat, self.packed, self.group, self.scales_zeros, self.blocks)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def plain_dense(self) -> torch.Tensor:
        """The dense weights [out, in] in the plain layout."""
        return onednn.unpack(self.dense, self.in_features) if self.dense_packed else self.dense

    def set_dense(self, dense: torch.Tensor) -> None:
        """Keeps `dense` (plain) as the dense weights, prepacked for oneDNN where it can be."""
        self.dense, self.dense_packed = onednn.prepared(dense)


def _pack_int4(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's packed 4-bit codes [out, in / 2] and its scales and offsets [in / group,
    out, 2]. Each output row is quantized on its own (groups run along the input)."""
    out_f, in_f = weight.shape
    w = weight.detach().float().reshape(out_f, in_f // group, group)
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-8).to(torch.bfloat16)
    # torch's kernel computes (q - 8) * scale + zero: zero is the group's value at q = 8
    zero = (low + 8 * scale.float()).to(torch.bfloat16)
    # codes against the offset as rounded, so its rounding error is absorbed where it can be
    q = ((w - zero.float()) / scale.float() + 8).round().clamp(0, 15)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        q.to(torch.int32).reshape(out_f, in_f), 1
    )
    return packed, torch.cat([scale, zero], -1).transpose(0, 1).contiguous()


class FusedInt4(nn.Module):
    """Several Int4Linear of the same input as one 4-bit matmul, for decode (few rows): q, k
    and v, or gate and up. One kernel call instead of three (or two) costs one dispatch and
    one pass over the input; each output row is computed on its own, so the fused result is
    bit for bit the parts' outputs side by side (tests/inference/test_quant.py checks it).

    It holds no bfloat16 weights: many rows (prefill, big batches) go through the parts. The
    parts' packed codes become views of the fused ones where the kernel's row blocks allow, so
    fusing costs no memory beyond the (small) scales."""

    def __init__(self, parts: list[Int4Linear]) -> None:
        super().__init__()
        first = parts[0]
        if any(p.in_features != first.in_features or p.group != first.group for p in parts):
            raise ValueError("fused Int4Linear parts must share their input size and group")
        if len({p.bias is None for p in parts}) > 1:
            raise ValueError("fused Int4Linear parts must all have a bias, or none")
        self.in_features, self.group = first.in_features, first.group
        self.sizes = [p.out_features for p in parts]
        self.out_features = sum(self.sizes)
        bias = None if first.bias is None else torch.cat([p.bias for p in parts])
        self.register_buffer("bias", bias)
        if first.blocks is not None:  # q4mm's rows are independent: the parts' side by side
            self._fuse_blocks(parts)
            return
        packed, scales_zeros = _pack_int4(torch.cat([p.plain_dense() for p in parts]), first.group)
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", scales_zeros)
        self.register_buffer("blocks", None)
        start = 0
        for p in parts:
            rows = packed[start : start + p.out_features]
            if torch.equal(rows, p.packed):
                p.packed = rows
            start += p.out_features

    def _fuse_blocks(self, parts: list[Int4Linear]) -> None:
        self.register_buffer("packed", None)
        self.register_buffer("scales_zeros", None)
        self.register_buffer("blocks", torch.cat([p.blocks for p in parts]))
        start = 0
        for p in parts:
            p.blocks = self.blocks[start : start + p.out_features]
            start += p.out_features

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        """flat [rows, in] in bfloat16 -> [rows, out] (the parts' outputs, side by side)."""
        y = int4_mm(flat, self.packed, self.group, self.scales_zeros, self.blocks)
        return y if self.bias is None else y + self.bias


_TORCH_INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default


def int4_mm(
    flat: torch.Tensor,
    packed: torch.Tensor | None,
    group: int,
    scales_zeros: torch.Tensor | None,
    blocks: torch.Tensor | None,
) -> torch.Tensor:
    """flat [rows, in] bfloat16 times a 4-bit layer's weights, through whichever kernel the
    layer holds weights for (blocks: q4mm's; else torch's)."""
    if blocks is not None:
        return q4mm.mm(blocks, flat, blocks.shape[0])
    return _TORCH_INT4_MM(flat, packed, group, scales_zeros)


class Int8Linear(nn.Module):
    """y = x W^T with W in int8; `weight` (bfloat16) serves many rows. Few rows go through
    torch's kernel (one scale per output row) or, with kernel="native", q4mm's (GGUF's Q8_0:
    a float16 scale per 32 weights)."""

    def __init__(self, weight: torch.Tensor, kernel: str = "torch") -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        native = kernel == "native" and self.in_features % q4mm.QK == 0
        q, scale = (None, None) if native else _per_row_int8(weight)
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.register_buffer("blocks", q4mm.pack8(weight) if native else None)
        self.weight = weight  # shared with the embedding: costs no memory
        # a prefill's call prepacked for oneDNN (inference/onednn.py): a copy (the embedding
        # needs the plain layout), 56 MB for the bundled model, which saved the reorder of the
        # whole weight in every prompt's last step
        self.many_rows_weight, self.many_rows_packed = onednn.prepared(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if not _few_rows(x):
            weight, packed = self.many_rows_weight, self.many_rows_packed
            return _many_rows(x, weight, None, HEAD_TILE, packed=packed)
        flat = x.reshape(-1, self.in_features)
        if self.blocks is not None:
            y = q4mm.mm8(self.blocks, flat, self.out_features)
        else:
            y = torch._weight_int8pack_mm(flat, self.q, self.scale)
        return y.reshape(*x.shape[:-1], self.out_features)


def _per_row_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's int8 kernel's weights: codes [out, in] and one bfloat16 scale per output row."""
    w = weight.detach().float()
    scale = (w.abs().amax(1) / 127).clamp(min=1e-8)
    q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, scale.to(torch.bfloat16)


def invariant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tile: int = TILE,
    packed: bool = False,
) -> torch.Tensor:
    """F.linear, each output row with the same bits whatever rows come with it in the call.

    oneDNN picks its bfloat16 kernel by the call's row count, and on CPUs with AMX (Intel
    Sapphire Rapids and later) the kernels for different counts sum in different orders: a
    prompt's KV, and so a greedy reply, would change with the chunk size, the prompts packed
    beside it and the cached prefix. Calls of exactly TILE rows (the last one zero padded)
    always take the same kernel, which is as fast for hundreds of rows. The rows past the
    last whole tile go in a smaller call where this CPU was seen to give them the same bits
    (inference/narrow.py): a next turn's few new tokens need not pay for a whole tile.
    `packed`: `weight` is in oneDNN's layout (inference/onednn.py)."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    whole = rows - rows % tile
    out = [onednn.linear(flat[i : i + tile], weight, bias, packed) for i in range(0, whole, tile)]
    if rows > whole:
        width = narrow.linear_rows(rows - whole, weight, bias, tile, packed)
        last = torch.cat([flat[whole:], flat.new_zeros((whole + width - rows, flat.shape[1]))])
        out.append(onednn.linear(last, weight, bias, packed)[: rows - whole])
    return torch.cat(out).reshape(*x.shape[:-1], weight.shape[0])


def _many_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tile: int = TILE,
    packed: bool = False,
) -> torch.Tensor:
    if weight.dtype != x.dtype:  # float32 dense weights (set_dense_dtype): bfloat16 in and out
        bias = None if bias is None else bias.to(weight.dtype)
        return _many_rows(x.to(weight.dtype), weight, bias, tile, packed).to(x.dtype)
    if dense_forced():  # a prefill: its bits must not depend on the packing
        return invariant_linear(x, weight, bias, tile, packed)
    return onednn.linear(x, weight, bias, packed)


def _few_rows(x: torch.Tensor) -> bool:
    return x.numel() <= FEW_ROWS * x.shape[-1] and not dense_forced()


def dense_forced() -> bool:
    """Whether this thread is inside dense_only() (a prefill)."""
    return getattr(_dense, "on", False)


@contextlib.contextmanager
def dense_only() -> Iterator[None]:
    """Every call in this thread goes through the bfloat16 weights, however few its rows.

    Prefill uses it: a prompt's KV must not depend on how many of its tokens one call carried
    (a chunk's last few tokens, the rest after a cached prefix), and below FEW_ROWS rows they
    would otherwise meet the 4-bit weights."""
    before = dense_forced()
    _dense.on = True
    try:
        yield
    finally:
        _dense.on = before


class TiledLinear(nn.Linear):
    """nn.Linear whose prefill rows get the same bits however they are packed (bfloat16 and
    float32 models on CPU: invariant_linear)."""

    tile = TILE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _many_rows(x, self.weight, self.bias, self.tile)


class TiledHead(TiledLinear):
    """The LM head's TiledLinear: a prefill asks it for HEAD_TILE rows, in one call."""

    tile = HEAD_TILE


def tile_prefill(model: Any) -> Any:
    """Every nn.Linear of `model` multiplies a prefill in fixed tiles, in place."""
    head = getattr(model, "lm_head", None)
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = TiledHead if module is head else TiledLinear
    return model


def quantize_int4(model: Any, kernel: str = "torch", head_kernel: str | None = None) -> Any:
    """Replaces the decoder's Linear layers (int4) and the LM head (int8), in place. `kernel`:
    the few-row 4-bit kernel the layers hold weights for, "torch" or "native" (q4mm);
    `head_kernel`: the head's (None: the same)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not isinstance(getattr(model, "lm_head", None), nn.Linear):
        raise ValueError(
            f"DTYPE=int4 knows decoder models with model.layers and an lm_head "
            f"(Llama, Qwen, Mistral...), not {type(model).__name__}; use bfloat16"
        )
    for layer in layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and fits(child):  # others stay bfloat16
                    setattr(parent, name, Int4Linear(child, kernel=kernel))
        fuse_layer(layer)
    head = Int8Linear(model.lm_head.weight.to(torch.bfloat16), kernel=head_kernel or kernel)
    model.lm_head = head
    # what did not fit stays bfloat16, in prefill tiles: a prefill step pads nothing itself
    return tile_prefill(model)


# bfloat16 must be this much slower than float32 before a prefill pays for float32's weights
# (twice the memory of the dense copies, and a greedy reply may change in its last bits)
SLOWER = 1.25


def dense_dtype(model: Any) -> torch.dtype | None:
    """The dtype the int4 layers multiply many rows in (a prefill); None: not an int4 model."""
    for module in model.modules():
        if isinstance(module, Int4Linear):
            return module.dense.dtype
    return None


def set_dense_dtype(model: Any, dtype: torch.dtype) -> None:
    """Keeps the int4 layers' dense weights (a prefill's, a big batch's) in `dtype`, in place,
    prepacked for oneDNN where it can (inference/onednn.py)."""
    for module in model.modules():
        if isinstance(module, Int4Linear):
            module.set_dense(module.plain_dense().to(dtype))
    onednn.release_freed()


def faster_dense_dtype(model: Any, rounds: int = 5) -> torch.dtype:
    """bfloat16 or float32, whichever multiplies a prefill tile through the model's largest
    int4 layer faster on this CPU. With AMX, oneDNN's bfloat16 is several times float32's
    speed; without it, bfloat16 can be the slower one (an Intel Xeon with AVX-512 BF16 but no
    AMX: 1.7x float32's time for the bundled model's layers, 1 and 2 threads)."""
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    if not layers:
        return torch.bfloat16
    dense = max(layers, key=lambda m: m.dense.numel()).plain_dense()
    x = torch.randn(TILE, dense.shape[1], dtype=torch.bfloat16)
    weights = {  # as set_dense_dtype would keep them
        torch.bfloat16: onednn.prepared(dense.to(torch.bfloat16)),
        torch.float32: onednn.prepared(dense.to(torch.float32)),
    }
    calls = {
        dtype: functools.partial(_dense_call, x, dtype, *prepared)
        for dtype, prepared in weights.items()
    }
    best = quiet_timing.fastest(calls, rounds)
    return torch.float32 if best[torch.bfloat16] > SLOWER * best[torch.float32] else torch.bfloat16


def _dense_call(x: torch.Tensor, dtype: torch.dtype, w: torch.Tensor, is_packed: bool) -> None:
    onednn.linear(x.to(dtype), w, None, is_packed).to(torch.bfloat16)


def kernel_of(model: Any) -> str:
    """The few-row kernel an int4 model's layers hold weights for: "native" or "torch"."""
    for module in model.modules():
        if isinstance(module, Int4Linear):
            return "native" if module.blocks is not None else "torch"
    return head_kernel_of(model)


def head_kernel_of(model: Any) -> str:
    """The few-row kernel of an int4 model's LM head: "native" (Q8_0 blocks) or "torch"."""
    return "native" if getattr(model.lm_head, "blocks", None) is not None else "torch"


def choose_kernel(model: Any, setting: str = "auto", rounds: int = 7) -> str:
    """The few-row 4-bit kernel for `model`'s layers (before quantize_int4): "torch" or
    "native". auto times both on one row through the model's largest Linear of its layers and
    keeps q4mm where it was faster (a CPU without AVX-512: ~2x torch's speed on a Zen 3);
    torch's where q4mm cannot be built here. "native" where it cannot be built is an error."""
    if not _native_allowed(setting):
        return "torch"
    if setting == "native":
        return "native"
    linears = [m for m in model.model.layers.modules() if isinstance(m, nn.Linear) and fits(m)]
    if not linears:
        return "torch"
    largest = max(linears, key=lambda m: m.weight.numel())
    layers = {k: Int4Linear(largest, kernel=k) for k in ("torch", "native")}
    return _faster(layers, largest.in_features, rounds)


HEAD_PROBE_ROWS = 8192  # of the LM head, timed by choose_head_kernel


def choose_head_kernel(model: Any, setting: str = "auto", rounds: int = 7) -> str:
    """The LM head's few-row 8-bit kernel, chosen apart from the layers' (choose_kernel): on
    a Zen 4 torch's 4-bit layers and q4mm's are as fast as each other, but q4mm's Q8_0 head
    multiplied one row in 0.56 ms where torch's int8 kernel took 1.52 (and 4 rows in 1.4
    against 3.0), a tenth of a decode step."""
    if not _native_allowed(setting):
        return "torch"
    head = model.lm_head
    if setting == "native":
        return "native"
    if head.in_features % q4mm.QK:  # not in Q8_0 blocks: torch's either way
        return "torch"
    # the first rows only: both kernels take time in proportion to the rows, and building
    # the whole head twice more added ~0.9 s to every start (49,152 x 576)
    weight = head.weight.detach()[:HEAD_PROBE_ROWS].to(torch.bfloat16)
    heads = {k: Int8Linear(weight, kernel=k) for k in ("torch", "native")}
    return _faster(heads, head.in_features, rounds)


def _native_allowed(setting: str) -> bool:
    """Whether q4mm may be used under INT4_KERNEL=`setting`; "native" where it cannot be
    built here is an error."""
    if setting == "torch":
        return False
    if q4mm.available():
        return True
    if setting == "native":
        raise ValueError(
            "INT4_KERNEL=native: the 4-bit kernel could not be built on this machine "
            "(it needs a C compiler and an x86-64 CPU with AVX2); use auto or torch"
        )
    return False


def _faster(layers: dict[str, nn.Module], in_features: int, rounds: int) -> str:
    """The key of `layers` ("native" or "torch") whose one-row call was faster (best of
    `rounds`)."""
    x = torch.randn(1, 1, in_features, dtype=torch.bfloat16)
    with torch.inference_mode():
        best = quiet_timing.fastest({k: functools.partial(m, x) for k, m in layers.items()}, rounds)
    return "native" if best["native"] < best["torch"] else "torch"


FUSED = {
    "self_attn": ("qkv_int4", ("q_proj", "k_proj", "v_proj")),
    "mlp": ("gate_up_int4", ("gate_proj", "up_proj")),
}


def fuse_layer(layer: nn.Module) -> None:
    """Adds `self_attn.qkv_int4` and `mlp.gate_up_int4` (FusedInt4) where all their parts
    are Int4Linear; transformers' forward never calls them (inference/decode_step.py does)."""
    for block_name, (fused_name, part_names) in FUSED.items():
        block = getattr(layer, block_name, None)
        parts = [getattr(block, name, None) for name in part_names]
        if block is not None and all(isinstance(p, Int4Linear) for p in parts):
            setattr(block, fused_name, FusedInt4(parts))
