"""inference/attention.py: one query per row, as sdpa computes it (random tensors, CPU), through
the native kernel (inference/attend1.c) where it is built and through torch's calls."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from inference import attention, prefill_attention, q4mm
from inference.attention import handles, one_query

HEADS, KV_HEADS, DIM = 9, 3, 64

needs_native = pytest.mark.skipif(
    not q4mm.available(), reason="the native kernels cannot be built on this machine"
)


@pytest.fixture(params=["native", "torch"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test through each of one_query's two ways."""
    if request.param == "native" and not q4mm.available():
        pytest.skip("the native kernels cannot be built on this machine")
    monkeypatch.setattr(attention, "_native_on", request.param == "native")
    return request.param


def _qkv(rows: int, keys: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, HEADS, 1, DIM, generator=g).to(torch.bfloat16)
    k = (torch.randn(rows, KV_HEADS, keys, DIM, generator=g) * 2).to(torch.bfloat16)
    v = torch.randn(rows, KV_HEADS, keys, DIM, generator=g).to(torch.bfloat16)
    return q, k, v


def _exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """float64 attention, key heads repeated for their query heads -> [b, 1, H, D]."""
    rep = HEADS // KV_HEADS
    k, v = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    scores = (q.double() @ k.transpose(-1, -2)) * DIM**-0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, -1) @ v).transpose(1, 2)


@pytest.mark.parametrize("keys", [5, 300, 2100])
def test_one_query_is_as_close_to_exact_attention_as_sdpa(keys: int, implementation: str) -> None:
    q, k, v = _qkv(4, keys)
    mask = torch.ones(4, 1, 1, keys, dtype=torch.bool)
    mask[1, ..., : keys // 2] = False  # a left-padded row
    ours = one_query(q, k, v, mask, DIM**-0.5)
    sdpa = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=DIM**-0.5, enable_gqa=True
    ).transpose(1, 2)
    exact = _exact(q, k, v, mask)
    assert ours.shape == (4, 1, HEADS, DIM) and ours.dtype == torch.bfloat16
    ours_err = (ours.double() - exact).abs().max().item()
    sdpa_err = (sdpa.double() - exact).abs().max().item()
    assert ours_err <= sdpa_err * 1.01 + 1e-6


def test_masked_keys_do_not_count(implementation: str) -> None:
    q, k, v = _qkv(1, 40)
    mask = torch.ones(1, 1, 1, 40, dtype=torch.bool)
    mask[..., :25] = False
    assert torch.equal(
        one_query(q, k, v, mask, 0.125), one_query(q, k[:, :, 25:], v[:, :, 25:], None, 0.125)
    )


def test_an_additive_mask_is_added(implementation: str) -> None:
    q, k, v = _qkv(2, 30)
    keep = torch.ones(2, 1, 1, 30, dtype=torch.bool)
    keep[0, ..., :10] = False
    additive = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    assert torch.equal(one_query(q, k, v, keep, 0.125), one_query(q, k, v, additive, 0.125))


@needs_native
def test_the_native_kernel_serves_bfloat16_kv_and_agrees_with_the_torch_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q, k, v = _qkv(4, 700)
    mask = torch.ones(4, 1, 1, 700, dtype=torch.bool)
    mask[2, ..., :300] = False
    assert attention._native_args(q, k, v, mask) is not None
    native = one_query(q, k, v, mask, 0.125)
    monkeypatch.setattr(attention, "_native_on", False)
    calls = one_query(q, k, v, mask, 0.125)
    # float32 sums in another order: at most one bfloat16 rounding apart, mostly the same
    assert ((native.float() - calls.float()).abs() <= calls.float().abs() * 2**-7 + 1e-6).all()
    assert (native == calls).float().mean() > 0.95


@needs_native
def test_a_rows_native_attention_depends_neither_on_the_rows_beside_it_nor_on_the_threads() -> None:
    """Enough keys that the kernel splits the rows among threads."""
    q, k, v = _qkv(5, 2100, seed=3)
    mask = torch.ones(5, 1, 1, 2100, dtype=torch.bool)
    mask[1, ..., :700] = False
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat(
            [
                one_query(q[r : r + 1], k[r : r + 1], v[r : r + 1], mask[r : r + 1], 0.125)
                for r in range(5)
            ]
        )
        torch.set_num_threads(2)
        together = one_query(q, k, v, mask, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, together)


@needs_native
def test_the_native_kernel_reads_keys_and_values_where_they_lie() -> None:
    """A cache's keys are a view into a buffer with room to grow, its values another."""
    q, k, v = _qkv(2, 64)
    room_k = torch.zeros(2, KV_HEADS, 100, DIM, dtype=torch.bfloat16)
    room_v = torch.zeros(2, KV_HEADS, 100, DIM, dtype=torch.bfloat16)
    room_k[:, :, :64], room_v[:, :, :64] = k, v
    views = one_query(q, room_k[:, :, :64], room_v[:, :, :64], None, 0.125)
    assert torch.equal(views, one_query(q, k.contiguous(), v.contiguous(), None, 0.125))


def test_kv_the_native_kernel_does_not_take_goes_through_the_torch_calls() -> None:
    """float32 KV and heads wider than 128 (sdpa's error bound, as above)."""
    q, k, v = _qkv(2, 40)
    exact = _exact(q, k, v, None)
    q32, k32, v32 = q.float(), k.float(), v.float()
    assert attention._native_args(q32, k32, v32, None) is None
    got = one_query(q32, k32, v32, None, DIM**-0.5)
    assert got.dtype == torch.float32
    assert (got.double() - exact).abs().max() < 1e-5
    wide = (
        torch.randn(1, 2, 1, 256).to(torch.bfloat16),
        torch.randn(1, 1, 9, 256).to(torch.bfloat16),
    )
    assert attention._native_args(wide[0], wide[1], wide[1], None) is None
    assert one_query(wide[0], wide[1], wide[1], None, 1 / 16).shape == (1, 1, 2, 256)


def test_only_single_queries_on_cpu_without_extras_are_handled() -> None:
    one, many = torch.zeros(1, HEADS, 1, DIM), torch.zeros(1, HEADS, 7, DIM)
    assert handles(one, {"dropout": 0.0})
    assert not handles(many, {})
    assert not handles(one, {"position_bias": torch.zeros(1)})
    assert not handles(one, {"dropout": 0.1})


@pytest.mark.parametrize("faster", [True, False])
def test_the_registered_attention_sends_a_decode_step_to_the_faster_one(
    monkeypatch: pytest.MonkeyPatch, faster: bool
) -> None:
    monkeypatch.setattr(attention, "_pays", faster)
    q, k, v = _qkv(3, 50)
    module = torch.nn.Module()
    module.num_key_value_groups, module.layer_idx = HEADS // KV_HEADS, 0
    out, _ = prefill_attention.attention(module, q, k, v, None, dropout=0.0, scaling=0.125)
    ours = one_query(q, k, v, None, 0.125)
    theirs, _ = prefill_attention._sdpa(module, q, k, v, None, dropout=0.0, scaling=0.125)
    assert not torch.equal(ours, theirs)  # else this test could not tell them apart
    assert torch.equal(out, ours if faster else theirs)


@pytest.mark.parametrize("slow", ["sdpa", "ours"])
def test_the_measurement_picks_the_faster_attention(
    monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """AMD EPYC: one_query a quarter of sdpa's time; an Intel Xeon without AMX: 2.6x it."""

    def delayed(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.003)
            return fn(*args, **kwargs)

        return call

    if slow == "sdpa":
        monkeypatch.setattr(
            attention.F, "scaled_dot_product_attention", delayed(F.scaled_dot_product_attention)
        )
    else:
        monkeypatch.setattr(attention, "one_query", delayed(one_query))
    assert attention.measure(keys=50, rounds=2) == (slow == "sdpa")
