"""bench.bandwidth's arithmetic: bytes read per decoded token, the machine's read bandwidth."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from bench.bandwidth import decode_rate, gguf_bytes, kv_bytes, our_bytes, read_bandwidth
from bench.measure import Result

SMOLLM2 = SimpleNamespace(
    hidden_size=576, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=30
)


def test_kv_bytes_count_keys_and_values_of_every_layer() -> None:
    # 30 layers x (keys + values) x 3 heads x 64 dims x 2 bytes per position
    assert kv_bytes(SMOLLM2, 100) == 30 * 2 * 3 * 64 * 2 * 100
    assert kv_bytes(SMOLLM2, 100, element=4) == 2 * kv_bytes(SMOLLM2, 100)


def test_a_stream_decode_rate_leaves_the_first_token_out() -> None:
    r = Result(tokens=65, ttft=[0.5], wall=2.5)
    assert decode_rate(r) == pytest.approx(64 / 2.0)


def test_read_bandwidth_is_a_plausible_figure() -> None:
    assert 1e8 < read_bandwidth(mb=64, repeats=3) < 1e13


def _tiny_int4_model(kernel: str = "torch") -> Any:
    from inference.quant import quantize_int4

    layer = torch.nn.Module()
    layer.self_attn = torch.nn.Module()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        setattr(layer.self_attn, name, torch.nn.Linear(64, 64, bias=False))
    layer.input_layernorm = torch.nn.LayerNorm(64)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer])
    model.lm_head = torch.nn.Linear(64, 100, bias=False)
    model.config = SimpleNamespace(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1
    )
    return quantize_int4(model.to(torch.bfloat16), kernel=kernel)


@pytest.mark.parametrize("kernel", ["torch", "native"])
def test_our_bytes_count_each_4bit_weight_once_though_qkv_is_fused(kernel: str) -> None:
    from inference import q4mm

    if kernel == "native" and not q4mm.available():
        pytest.skip("the native 4-bit kernel cannot be built here")
    parts = our_bytes(_tiny_int4_model(kernel), context=10)
    weights = 4 * 64 * 64
    assert parts["int4 codes"] == weights // 2  # 4 bits each; the fused q/k/v not again
    assert parts["int4 scales+offsets"] == weights // 32 * 2 * 2  # a 16-bit pair per 32
    scales = 100 * 2 if kernel == "torch" else 100 * 64 // 32 * 2  # per row, or per 32
    assert parts["int8 LM head + scales"] == 100 * 64 + scales
    assert parts["KV"] == kv_bytes(
        SimpleNamespace(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1
        ),
        10,
    )


@pytest.mark.model
def test_gguf_bytes_are_the_files_tensors() -> None:
    from inference.model_store import bundled_gguf

    path = bundled_gguf()
    parts = gguf_bytes(str(path), SMOLLM2, context=0)
    # the tensors are nearly all of the file (the rest: vocabulary and metadata)
    assert 0.8 * path.stat().st_size < parts["weights as stored"] < path.stat().st_size
