"""Weights prepacked once in oneDNN's blocked layout, for a prefill's matmuls.

F.linear hands oneDNN a plain [out, in] weight, which it reorders into its blocked layout on
every call: for a next turn's few rows that reorder is a third of the call (the bundled
model's 30 layers at 16 rows, weights not in cache, on a 2-core Zen 5: 21.5 ms through
F.linear, 14.1 ms prepacked; at 128 rows 61.8 and 46.2 ms). The int4 layers' packed dense
weights replace their plain ones (same bytes), and `unpack` gives a plain one back exactly
when it is needed (a change of dtype); the LM head keeps a packed copy beside the embedding.
float32 weights (PREFILL_DTYPE=float32, the choice of CPUs without AMX) are packed the same
way: on a 2-core AVX2 AMD EPYC (Zen 3) the 30 layers at 16 rows took 64-67 ms through
F.linear and 48-52 ms packed, at 128 rows 200 and 197 ms.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F


def supported(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.bfloat16, torch.float32)
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` [out, in] in oneDNN's layout, or None where that is not possible here (or
    would not give the weight back exactly)."""
    if not supported(weight):
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
        if torch.equal(unpack(packed, weight.shape[1]), weight):
            return packed
    except RuntimeError:
        pass
    return None


def prepared(weight: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """`weight` packed where it can be, else as it is; and whether it was packed."""
    packed = pack(weight)
    return (weight, False) if packed is None else (packed, True)


def unpack(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """The plain [out, in] weight of `packed`: the identity through it, exact (each output is
    one weight times 1, summed with zeros)."""
    eye = torch.eye(in_features, dtype=packed.dtype)
    return linear(eye, packed, None, True).t().contiguous()


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool
) -> torch.Tensor:
    """F.linear, through a packed weight where `packed`."""
    if not packed:
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


def release_freed() -> None:
    """Hands the pages of freed tensors back to the system. glibc keeps the plain weights'
    pages once they are replaced by packed ones: the server's resident memory stayed at
    1.0-1.2 GB instead of 0.8 GB after loading the bundled model."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
