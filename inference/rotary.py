"""A decode step's rotary embedding in one native call, bit for bit torch's.

transformers' apply_rotary_pos_emb is five torch calls per tensor (x * cos, the two halves
sliced, one negated, put back together, times sin, the sum), ~9-10 µs for q and k of 1-4 rows
on a 2-core AMD EPYC (Zen 5), once per layer of every decode step. inference/rotary.c does
the same elementwise arithmetic, each product and the sum rounded to bfloat16 as torch's
kernels round them, so its bits are torch's: nothing else needs to change with it
(tests/inference/test_rotary.py compares them bit for bit).
"""

from __future__ import annotations

import torch

from inference import q4mm

_native_on = True  # tests and bench.attention switch it off to compare


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, H, 1, d] rotated by cos and sin [b, 1, 1, d] (a decode step's positions)."""
    lib = q4mm.library() if _native_on else None
    if lib is None or not _fits(x, cos, sin):
        return torch_rotate(x, cos, sin)
    b, heads, _, dim = x.shape
    if not (cos.is_contiguous() and sin.is_contiguous()):
        cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((b, heads, 1, dim), dtype=torch.bfloat16)
    status = lib.rotary(
        x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), b, heads, dim
    )
    if status:
        raise RuntimeError(f"the native rotary embedding failed ({status}) on {tuple(x.shape)}")
    return out


def _fits(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    bf16 = torch.bfloat16
    if x.dim() != 4 or x.device.type != "cpu" or x.shape[2] != 1 or x.shape[3] % 16:
        return False
    if x.dtype != bf16 or cos.dtype != bf16 or sin.dtype != bf16:
        return False
    b, _, _, dim = x.shape
    same = (b, 1, 1, dim)
    return x.stride(3) == 1 and x.stride(1) == dim and cos.shape == same and sin.shape == same


def torch_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # apply_rotary_pos_emb with rotate_half, op for op
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)
