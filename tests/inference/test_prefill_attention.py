"""Prefill attention in pieces: the same bits as one whole pass.

Random tensors (fast); tests/inference/test_hf_prefill.py checks the same on the bundled
model, where the linear layers, norms and activations must keep each row's bits too."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from inference import narrow, prefill_attention
from inference.prefill import Piece, PrefillJob
from inference.prefill_attention import ATTN_BLOCK, PrefillPlan
from tests.support.prefill import DIM, KV_HEADS
from tests.support.prefill import prefill_job as job

HEADS = 9


def split(n: int, rng: random.Random) -> list[int]:
    sizes = []
    while n:
        sizes.append(min(n, rng.choice([1, 2, 5, 31, 32, 33, 100, 257])))
        n -= sizes[-1]
    return sizes


def run_pieces(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sizes: list[int]
) -> tuple[torch.Tensor, PrefillJob]:
    """Attention of one sequence prefilled in calls of `sizes` tokens (each packed after a
    decoy sequence, so a call also holds other rows)."""
    j, decoy = job(q.shape[2]), job(40)
    outs = []

    def row(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        return torch.cat([t[:, :, :7], t[:, :, lo:hi]], dim=2)

    for n in sizes:
        a = j.done
        pieces = [Piece(decoy, 0, 7, 0), Piece(j, a, n, 7)]
        out = PrefillPlan(pieces, KV_HEADS).attend(
            0, row(q, a, a + n), row(k, a, a + n), row(v, a, a + n), DIM**-0.5
        )
        outs.append(out[:, 7:])
        j.done += n
    return torch.cat(outs, dim=1), j


@pytest.fixture(scope="module")
def qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = 3 * ATTN_BLOCK + 77
    return tuple(
        torch.randn((1, h, n, DIM), generator=g).to(torch.bfloat16)
        for h in (HEADS, KV_HEADS, KV_HEADS)
    )


def test_attention_is_causal_attention(qkv: Any) -> None:
    q, k, v = qkv
    out, _ = run_pieces(q, k, v, [q.shape[2]])
    ref = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True
    )
    assert torch.allclose(out.float(), ref.transpose(1, 2), atol=2e-2)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_attention_bits_do_not_depend_on_the_pieces(qkv: Any, seed: int) -> None:
    q, k, v = qkv
    whole, whole_job = run_pieces(q, k, v, [q.shape[2]])
    parts, parts_job = run_pieces(q, k, v, split(q.shape[2], random.Random(seed)))
    assert torch.equal(parts, whole)
    assert torch.equal(parts_job.kv, whole_job.kv)


def test_a_few_queries_attend_in_their_own_rows_not_their_whole_tile(
    qkv: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A next turn's 30 new tokens mid-tile: where the probe allows it (forced here), attention
    takes their 32 rows of the tile (x3 query heads), not all 64, and puts the results back
    in place."""
    q, k, v = qkv
    sizes = [2 * ATTN_BLOCK + 40, 30, q.shape[2] - 2 * ATTN_BLOCK - 70]
    monkeypatch.setattr(narrow, "enabled", False)
    padded, padded_job = run_pieces(q, k, v, sizes)
    monkeypatch.setattr(narrow, "enabled", True)
    monkeypatch.setattr(narrow, "attention_widths", lambda key, prober: (16, 32, 48))
    rows: list[int] = []
    attend = prefill_attention._attend
    monkeypatch.setattr(
        prefill_attention, "_attend", lambda q, *a: rows.append(q.shape[2]) or attend(q, *a)
    )
    out, out_job = run_pieces(q, k, v, sizes)
    assert 3 * 32 in rows and 3 * prefill_attention.TILE in rows
    assert torch.allclose(out.float(), padded.float(), atol=1e-2)
    assert torch.allclose(out_job.kv.float(), padded_job.kv.float())


def test_a_few_queries_take_widths_in_steps_of_eight_rows(
    qkv: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same 30 tokens (rows 40-63 of one tile, 0-5 of the next) with every width the
    probe can allow: 24 rows and 8, where multiples of 16 took 32 and 16."""
    q, k, v = qkv
    sizes = [2 * ATTN_BLOCK + 40, 30, q.shape[2] - 2 * ATTN_BLOCK - 70]
    whole, _ = run_pieces(q, k, v, [q.shape[2]])
    monkeypatch.setattr(narrow, "attention_widths", lambda key, prober: (8, 16, 24, 32, 40, 48, 56))
    rows: list[int] = []
    attend = prefill_attention._attend
    monkeypatch.setattr(
        prefill_attention, "_attend", lambda q, *a: rows.append(q.shape[2]) or attend(q, *a)
    )
    out, _ = run_pieces(q, k, v, sizes)
    assert 3 * 24 in rows and 3 * 8 in rows and 3 * 32 not in rows
    assert torch.allclose(out.float(), whole.float(), atol=1e-2)


def test_a_next_turns_few_queries_start_on_the_fine_grid(
    qkv: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """11 tokens at rows 39-49 of a tile (a next turn's question past the markup cached with
    the reply): 16 rows from 36 where the fine widths are allowed, 24 from 32 on the coarse
    grid alone; the same attention either way."""
    q, k, v = qkv
    start = 2 * ATTN_BLOCK + 39
    sizes = [start, 11, q.shape[2] - start - 11]
    whole, _ = run_pieces(q, k, v, [q.shape[2]])
    monkeypatch.setattr(
        narrow, "attention_widths", lambda key, prober: (4, 8, 12, 16, 24, 32, 40, 48, 56)
    )
    rows: list[int] = []
    attend = prefill_attention._attend
    monkeypatch.setattr(
        prefill_attention, "_attend", lambda q, *a: rows.append(q.shape[2]) or attend(q, *a)
    )
    out, _ = run_pieces(q, k, v, sizes)
    assert 3 * 16 in rows and 3 * 24 not in rows
    assert torch.allclose(out.float(), whole.float(), atol=1e-2)


@pytest.mark.parametrize(
    ("covered", "taken"),
    [
        ((39, 50), (36, 52)),  # fine grid: 16 rows
        ((40, 44), (40, 44)),
        ((62, 64), (60, 64)),
        ((30, 50), (24, 56)),  # 20 rows on the fine grid are wider than FINE_WIDTH: coarse
        ((58, 63), (56, 64)),
        ((1, 63), None),  # no width but the whole tile
    ],
)
def test_narrow_rows_cover_a_pieces_rows_on_the_grid_of_the_width_they_take(
    covered: tuple[int, int], taken: tuple[int, int] | None
) -> None:
    widths = (4, 8, 12, 16, 24, 32, 40, 48, 56)
    assert prefill_attention._narrow_rows(*covered, widths) == taken
