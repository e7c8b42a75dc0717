"""Attention for one query per row (a decode step) on CPU.

torch's CPU flash attention, which sdpa picks, costs about 1 µs per key per call for a single
query on an AMD EPYC (Zen 4, no AMX): 3.9 ms per layer against 4,000 keys, over 100 ms per decode
step across 30 layers. Plain float32 matmuls and a softmax do the same arithmetic (float32
scores and weights, as flash accumulates) in a fraction of that: 0.1 ms against 100 keys and
4 rows where sdpa took 0.4-0.5, 1.2 ms against 4,000 keys and 1 row where it took 3.9
(measured with random tensors, one thread). Its error against a float64 reference is the same as
sdpa's (the bfloat16 rounding of the output).

On an Intel Xeon without AMX the other way round: there sdpa took 0.27 ms against 4,000 keys
and 1 row, this 0.72 (it copies the keys to float32). So `pays()` times both once, in the
first decode step, and the faster one serves every decode step of the process.

The same arithmetic as ten torch calls is still ten calls a layer, each converting or
allocating, and on a slow CPU the calls cost more than the arithmetic. Where the native
kernels are built (inference/q4mm.py), inference/attend1.c does it in one call for bfloat16
KV (`python -m bench.attention` compares the two; bench/README.md keeps the figures). Each
row's result comes from that row alone, key after key in order, so it depends neither on the
rows beside it, nor on the thread count, nor on masked keys. Where it does not apply (float32
KV, a head wider than 128) the torch calls serve.

Every decode path calls it (inference/decode_step.py, and transformers' forward through
prefill_attention.attention), so they stay bit for bit the same as each other.
"""

from __future__ import annotations

import ctypes

import torch
from torch.nn import functional as F

from inference import q4mm, quiet_timing

FASTER = 1.2  # how much faster than sdpa this must be to be used (a tie goes to torch's own)
_pays: bool | None = None
_native_on = True  # tests switch it off to check the torch calls
NATIVE_MAX_DIM = 128  # the widest head inference/attend1.c keeps in registers


def pays() -> bool:
    """Whether one_query beats torch's sdpa on this CPU (timed on the first call)."""
    global _pays
    if _pays is None:
        _pays = measure()
    return _pays


def measure(keys: int = 1000, rounds: int = 5) -> bool:
    """One query row of SmolLM2's shape (9 heads over 3 KV heads of 64) against `keys` keys,
    each way, best of `rounds`: whether one_query takes at most 1 / FASTER of sdpa's time."""
    q = torch.randn(1, 9, 1, 64).to(torch.bfloat16)
    k, v = (torch.randn(1, 3, keys, 64).to(torch.bfloat16) for _ in range(2))
    calls = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "ours": lambda: one_query(q, k, v, None, 0.125),
    }
    best = quiet_timing.fastest(calls, rounds)
    return best["ours"] * FASTER <= best["sdpa"]


def handles(query: torch.Tensor, kwargs: dict) -> bool:
    """One query per row on CPU, with nothing sdpa-specific asked for."""
    return (
        query.device.type == "cpu"
        and query.shape[2] == 1
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("dropout")
    )


def one_query(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """query [b, H, 1, D], key/value [b, KV, T, D], mask [b, 1, 1, T] (bool: True attends;
    float: added) or None -> [b, 1, H, D], as transformers' sdpa_attention_forward returns it.
    The native kernel where it is built and the tensors fit it, else torch's calls."""
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.float()  # added to float32 scores (kept alive here for the native call)
    native = _native_args(query, key, value, mask)
    if native is None:
        return _torch_one_query(query, key, value, mask, scaling)
    b, heads, _, dim = query.shape
    out = torch.empty((b, 1, heads, dim), dtype=torch.bfloat16)
    status = q4mm.library().attend1(*native, ctypes.c_float(scaling), out.data_ptr())
    if status:
        raise RuntimeError(f"the native attention failed ({status}) on {tuple(key.shape)}")
    return out


def _native_args(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> tuple | None:
    """attend1's arguments up to the scale, or None where it does not apply here (a decode
    step's 30 calls: the checks are plain comparisons)."""
    lib = q4mm.library() if _native_on else None
    if lib is None or query.device.type != "cpu":
        return None
    b, heads, _, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    if keys == 0 or key.shape[0] != b or dim % 8 or dim > NATIVE_MAX_DIM:
        return None
    bf16 = torch.bfloat16
    if query.dtype != bf16 or key.dtype != bf16 or value.dtype != bf16:
        return None
    if query.stride(3) != 1 or query.stride(1) != dim or key.stride(3) != 1:
        return None
    if value.stride(3) != 1 or value.shape != key.shape or heads % kv_heads:
        return None
    keep = add = (0, 0, 0)
    if mask is not None:
        if mask.dim() != 4 or mask.shape[1:] != (1, 1, keys) or mask.shape[0] not in (1, b):
            return None
        if mask.dtype == torch.bool:
            keep = (mask.data_ptr(), mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(3))
        elif mask.dtype == torch.float32:
            add = (mask.data_ptr(), mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(3))
        else:
            return None
    ks, vs = key.stride(), value.stride()
    return (
        query.data_ptr(), query.stride(0), key.data_ptr(), ks[0], ks[1], ks[2],
        value.data_ptr(), vs[0], vs[1], vs[2], *keep, *add, b, heads, kv_heads, keys, dim,
    )  # fmt: skip


def _torch_one_query(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    b, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    # a kv head's query heads as rows of one matmul (GQA without repeating the keys)
    q = query.reshape(b, kv_heads, heads // kv_heads, dim).float()
    scores = torch.matmul(q, key.float().transpose(-1, -2)) * scaling
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, value.float()).to(query.dtype)
    return out.reshape(b, 1, heads, dim)
