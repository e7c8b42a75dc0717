"""Prefill weights prepacked for oneDNN (bfloat16 and float32): the same weights, the same
products, and a dtype change gives the plain weights back exactly."""

import pytest
import torch

from inference import onednn, quant
from inference.quant import Int4Linear


def _packs(dtype: torch.dtype) -> bool:
    return onednn.pack(torch.zeros((16, 16), dtype=dtype)) is not None


# oneDNN packs bfloat16 only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT: on an
# AVX2-only Zen 3 the reorder raises, and the weights stay plain (the test below that one)
needs_packing = pytest.mark.skipif(
    not _packs(torch.bfloat16),
    reason="no oneDNN bfloat16 weight packing in this torch build or on this CPU",
)
PACKS_FLOAT32 = _packs(torch.float32)
packs_float32 = pytest.mark.skipif(
    not PACKS_FLOAT32, reason="no oneDNN float32 weight packing in this torch build"
)
# each dtype where this CPU packs it
PACKED = [
    pytest.param(torch.bfloat16, marks=needs_packing, id="bfloat16"),
    pytest.param(torch.float32, marks=packs_float32, id="float32"),
]
ATOL = {torch.bfloat16: 1e-1, torch.float32: 1e-4}  # a product's distance from float64's


@pytest.mark.parametrize("dtype", PACKED)
def test_a_packed_weight_unpacks_to_exactly_the_weight(dtype: torch.dtype) -> None:
    weight = torch.randn(1536, 576).to(dtype)
    packed = onednn.pack(weight)
    assert packed is not None and packed.dtype == dtype
    assert torch.equal(onednn.unpack(packed, 576), weight)


@pytest.mark.parametrize("dtype", PACKED)
def test_a_packed_weight_multiplies_like_the_plain_one(dtype: torch.dtype) -> None:
    weight, bias = torch.randn(192, 576).to(dtype), torch.randn(192).to(dtype)
    packed = onednn.pack(weight)
    for rows in (1, 16, 37, 128):
        x = torch.randn(2, rows, 576).to(dtype)
        out = onednn.linear(x, packed, bias, True)
        exact = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
        assert out.shape == (2, rows, 192) and out.dtype == dtype
        assert torch.allclose(out.double(), exact, rtol=1e-2, atol=ATOL[dtype])


def test_weights_that_cannot_be_packed_stay_plain() -> None:
    assert onednn.pack(torch.randn(64, 32, dtype=torch.float64)) is None  # F.linear's own path
    assert onednn.pack(torch.randn(2, 64, 32)) is None  # not a matrix
    assert onednn.linear(torch.ones(1, 2), torch.eye(2), None, False).tolist() == [[1.0, 1.0]]


def test_int4_layers_keep_plain_weights_where_this_cpu_cannot_pack_them(monkeypatch) -> None:
    def refuse(weight, bias):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support …")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse, raising=False)
    torch.manual_seed(0)
    layer = Int4Linear(torch.nn.Linear(576, 64, bias=False))
    plain = layer.dense.clone()
    quant.set_dense_dtype(torch.nn.Sequential(layer), torch.bfloat16)
    assert not layer.dense_packed and torch.equal(layer.dense, plain)
    x = torch.randn(quant.TILE, 576, dtype=torch.bfloat16)
    with quant.dense_only():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, plain))


@needs_packing
def test_int4_layers_keep_their_prefill_weights_packed_in_either_dtype_and_give_them_back() -> None:
    torch.manual_seed(0)
    layer = Int4Linear(torch.nn.Linear(576, 1536))
    model = torch.nn.Sequential(layer)
    plain = layer.dense.clone()
    quant.set_dense_dtype(model, torch.bfloat16)
    assert layer.dense_packed and torch.equal(layer.plain_dense(), plain)
    quant.set_dense_dtype(model, torch.float32)  # PREFILL_DTYPE=float32: packed as float32
    assert layer.dense_packed == PACKS_FLOAT32
    assert layer.dense.dtype == torch.float32 and torch.equal(layer.plain_dense(), plain.float())
    quant.set_dense_dtype(model, torch.bfloat16)
    assert layer.dense_packed and torch.equal(layer.plain_dense(), plain)
    x = torch.randn(2 * quant.TILE + 21, 576, dtype=torch.bfloat16)
    with quant.dense_only():
        whole = layer(x)
        part = layer(x[quant.TILE - 3 : quant.TILE + 40])
    assert torch.equal(part, whole[quant.TILE - 3 : quant.TILE + 40])  # a row's bits, packed
