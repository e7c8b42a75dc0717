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

Every decode path calls it (inference/decode_step.py, and transformers' forward through
prefill_attention.attention), so they stay bit for bit the same as each other.
"""

from __future__ import annotations

import time

import torch
from torch.nn import functional as F

FASTER = 1.2  # how much faster than sdpa this must be to be used (a tie goes to torch's own)
_pays: bool | None = None


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
    best = {"sdpa": float("inf"), "ours": float("inf")}
    for _ in range(rounds):
        for name in best:
            start = time.perf_counter()
            if name == "sdpa":
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            else:
                one_query(q, k, v, None, 0.125)
            best[name] = min(best[name], time.perf_counter() - start)
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
    float: added) or None -> [b, 1, H, D], as transformers' sdpa_attention_forward returns it."""
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
