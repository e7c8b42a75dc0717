"""PrefillJob factory shared by the prefill tests."""

from __future__ import annotations

import torch

from inference.prefill import PrefillJob
from inference.prefill_attention import ATTN_BLOCK

KV_HEADS, DIM = 3, 64


def prefill_job(n: int, done: int = 0) -> PrefillJob:
    """A job of n tokens (0..n-1), `done` of them prefilled, with a zeroed KV of one layer."""
    cap = -(-n // ATTN_BLOCK) * ATTN_BLOCK
    return PrefillJob(
        list(range(n)), torch.zeros((1, 2, KV_HEADS, cap, DIM), dtype=torch.bfloat16), done
    )
