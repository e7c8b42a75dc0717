"""Prefill weights prepacked for oneDNN: the same weights, the same products, and a dtype
change gives the plain weights back exactly."""

import pytest
import torch

from inference import onednn, quant
from inference.quant import Int4Linear

needs_packing = pytest.mark.skipif(
    not onednn.supported(torch.zeros((2, 2), dtype=torch.bfloat16)),
    reason="no oneDNN weight packing in this torch build",
)


@needs_packing
def test_a_packed_weight_unpacks_to_exactly_the_weight() -> None:
    weight = torch.randn(1536, 576).to(torch.bfloat16)
    packed = onednn.pack(weight)
    assert packed is not None
    assert torch.equal(onednn.unpack(packed, 576), weight)


@needs_packing
def test_a_packed_weight_multiplies_like_the_plain_one() -> None:
    weight, bias = torch.randn(192, 576).to(torch.bfloat16), torch.randn(192).to(torch.bfloat16)
    packed = onednn.pack(weight)
    for rows in (1, 16, 37, 128):
        x = torch.randn(2, rows, 576).to(torch.bfloat16)
        out = onednn.linear(x, packed, bias, True)
        exact = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
        assert out.shape == (2, rows, 192) and out.dtype == torch.bfloat16
        assert torch.allclose(out.float(), exact, rtol=1e-2, atol=1e-1)


def test_weights_that_cannot_be_packed_stay_plain() -> None:
    assert onednn.pack(torch.randn(64, 32)) is None  # float32: F.linear's own path
    assert onednn.linear(torch.ones(1, 2), torch.eye(2), None, False).tolist() == [[1.0, 1.0]]


@needs_packing
def test_int4_layers_keep_their_bfloat16_prefill_weights_packed_and_give_them_back() -> None:
    torch.manual_seed(0)
    layer = Int4Linear(torch.nn.Linear(576, 1536))
    model = torch.nn.Sequential(layer)
    plain = layer.dense.clone()
    quant.set_dense_dtype(model, torch.bfloat16)
    assert layer.dense_packed and torch.equal(layer.plain_dense(), plain)
    quant.set_dense_dtype(model, torch.float32)  # PREFILL_DTYPE=float32: F.linear, unpacked
    assert not layer.dense_packed and torch.equal(layer.dense, plain.float())
    quant.set_dense_dtype(model, torch.bfloat16)
    assert layer.dense_packed and torch.equal(layer.plain_dense(), plain)
    x = torch.randn(2 * quant.TILE + 21, 576, dtype=torch.bfloat16)
    with quant.dense_only():
        whole = layer(x)
        part = layer(x[quant.TILE - 3 : quant.TILE + 40])
    assert torch.equal(part, whole[quant.TILE - 3 : quant.TILE + 40])  # a row's bits, packed
