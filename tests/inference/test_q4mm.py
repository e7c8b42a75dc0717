"""The native 4-bit and 8-bit kernels (inference/q4mm.c) and how int4 layers choose them."""

from __future__ import annotations

import ctypes
import subprocess
import time

import pytest
import torch

from inference import q4mm, quant
from inference.quant import FEW_ROWS, FusedInt4, Int4Linear, Int8Linear

needs_native = pytest.mark.skipif(
    not q4mm.available(), reason="the native kernel cannot be built on this machine"
)


def _q4_1_weights(out_f: int, in_f: int) -> torch.Tensor:
    """Weights as a GGUF Q4_1 file holds them: code * scale + offset, float16 scale and
    offset per 32 inputs, every group using its lowest and highest code."""
    groups = in_f // 32
    scale = (torch.rand(out_f, groups, 1) * 0.02 + 0.001).to(torch.float16).float()
    offset = (torch.randn(out_f, groups, 1) * 0.05).to(torch.float16).float()
    codes = torch.randint(0, 16, (out_f, groups, 32)).float()
    codes[..., 0], codes[..., 1] = 0, 15
    return (codes * scale + offset).reshape(out_f, in_f)


def _pack4(w: torch.Tensor) -> torch.Tensor:
    """4-bit blocks in the kernel's layout."""
    return q4mm.interleave(q4mm.pack(w))


def _unpack4(blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    return q4mm.unpack(q4mm.deinterleave(blocks), in_features)


def test_packing_keeps_a_q4_1_files_own_blocks_exactly() -> None:
    torch.manual_seed(0)
    w = _q4_1_weights(64, 96)
    blocks = q4mm.pack(w)
    assert blocks.shape == (64, 96 // 32 * q4mm.BLOCK_BYTES) and blocks.dtype == torch.uint8
    assert torch.equal(q4mm.unpack(blocks, 96), w)


def test_packing_rounds_any_weight_to_within_half_a_step() -> None:
    torch.manual_seed(1)
    w = torch.randn(48, 64)
    got = q4mm.unpack(q4mm.pack(w), 64)
    groups = w.reshape(48, 2, 32)
    step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(32, 1)
    assert ((got - w).abs() <= 0.5 * step + 1e-3 * w.abs().max()).all()


def test_interleaving_rearranges_the_blocks_and_loses_nothing() -> None:
    torch.manual_seed(9)
    blocks = q4mm.pack(_q4_1_weights(24, 96))
    mixed = q4mm.interleave(blocks)
    assert mixed.shape == blocks.shape and not torch.equal(mixed, blocks)
    # a group's block starts with its 8 outputs' scales, then their 8 offsets
    first = mixed.reshape(3, -1)[0, :32].reshape(2, 8, 2)
    assert torch.equal(first[0], blocks[:8, 0:2]) and torch.equal(first[1], blocks[:8, 2:4])
    assert torch.equal(q4mm.deinterleave(mixed), blocks)
    # a group's rows are its own: outputs 8..15 interleave alone as they do among the rest
    assert torch.equal(q4mm.interleave(blocks[8:16]), mixed[8:16])


def test_interleaving_wants_whole_groups_of_outputs() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        q4mm.interleave(q4mm.pack(torch.randn(12, 64)))


def test_8bit_packing_rounds_each_weight_to_within_half_a_step() -> None:
    torch.manual_seed(2)
    w = torch.randn(40, 64)
    got = q4mm.unpack8(q4mm.pack8(w), 64)
    step = (w.reshape(40, 2, 32).abs().amax(-1) / 127).repeat_interleave(32, 1)
    assert ((got - w).abs() <= 0.51 * step).all()


@needs_native
@pytest.mark.parametrize("rows", [1, 2, 3, 5, FEW_ROWS])
@pytest.mark.parametrize("bits", [4, 8])
def test_the_kernels_multiply_like_their_weights_in_float(rows: int, bits: int) -> None:
    """Off only by the activations' 8-bit rounding (as llama.cpp's kernels are)."""
    torch.manual_seed(3)
    w = torch.randn(200 if bits == 8 else 96, 576)
    pack, unpack, mm = (
        (_pack4, _unpack4, q4mm.mm) if bits == 4 else (q4mm.pack8, q4mm.unpack8, q4mm.mm8)
    )
    blocks = pack(w)
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    got = mm(blocks, x, w.shape[0])
    want = x.float() @ unpack(blocks, 576).T
    assert got.shape == (rows, w.shape[0]) and got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() <= 0.02 * want.abs().max()


@needs_native
@pytest.mark.parametrize("bits", [4, 8])
def test_a_rows_bits_depend_neither_on_the_rows_beside_it_nor_on_the_threads(bits: int) -> None:
    """A stream's logits must not change with the batch it shares a step with."""
    torch.manual_seed(4)
    w = torch.randn(544, 576)
    blocks, mm = (_pack4(w), q4mm.mm) if bits == 4 else (q4mm.pack8(w), q4mm.mm8)
    x = torch.randn(FEW_ROWS + 3, 576, dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([mm(blocks, x[r : r + 1], 544) for r in range(x.shape[0])])
        torch.set_num_threads(2)
        together = mm(blocks, x, 544)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, together)


def _has_vnni() -> bool:
    flags = q4mm._cpu_flags().split()
    return "avx_vnni" in flags or {"avx512_vnni", "avx512vl"} <= set(flags)


def _build_without_vnni(tmp_path) -> ctypes.CDLL:
    target = tmp_path / "q4mm-plain.so"
    flags = [*q4mm.FLAGS, "-mno-avx512vnni", "-mno-avxvnni"]
    subprocess.run(["cc", *flags, "-o", str(target), str(q4mm.SOURCE)], check=True)
    lib = ctypes.CDLL(str(target))
    for fn in (lib.q4mm, lib.q8mm):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 3 + [ctypes.c_void_p]
    return lib


@needs_native
@pytest.mark.skipif(not _has_vnni(), reason="this CPU has no VNNI instructions")
@pytest.mark.parametrize("bits", [4, 8])
def test_the_vnni_build_gives_the_plain_avx2_builds_bits(tmp_path, bits: int) -> None:
    """A reply must not depend on which CPU family compiled the kernel: VNNI's one-instruction
    dot product and AVX2's two-instruction one give the same sums, even at the largest codes
    and activations (every activation rounds to +-127)."""
    torch.manual_seed(6)
    w = torch.randn(160, 576)
    w[:, ::7] *= 40  # groups whose codes reach both ends
    blocks, name = (_pack4(w), "q4mm") if bits == 4 else (q4mm.pack8(w), "q8mm")
    x = torch.sign(torch.randn(FEW_ROWS + 1, 576)).to(torch.bfloat16)
    x[1] = torch.randn(576).to(torch.bfloat16)
    plain = _build_without_vnni(tmp_path)
    got = q4mm._call(getattr(q4mm.library(), name), blocks, x, 160)
    assert torch.equal(got, q4mm._call(getattr(plain, name), blocks, x, 160))


@needs_native
def test_native_int4_layers_multiply_few_rows_in_4_bits_and_many_in_the_originals() -> None:
    torch.manual_seed(5)
    linear = torch.nn.Linear(96, 80, bias=True)
    layer = Int4Linear(linear, kernel="native")
    assert layer.packed is None and layer.blocks is not None
    few, many = torch.randn(1, 3, 96, dtype=torch.bfloat16), torch.randn(40, 96)
    want_few = few.float() @ _unpack4(layer.blocks, 96).T + linear.bias.float()
    assert torch.allclose(layer(few).float(), want_few, atol=0.03, rtol=0.02)
    want_many = many @ linear.weight.T + linear.bias
    assert torch.allclose(layer(many).float(), want_many.float(), atol=0.05, rtol=0.02)


@needs_native
@pytest.mark.parametrize("rows", [1, 3, FEW_ROWS])
def test_native_fused_layers_give_the_parts_outputs_bit_for_bit_on_shared_blocks(
    rows: int,
) -> None:
    torch.manual_seed(6)
    parts = [Int4Linear(torch.nn.Linear(576, n, bias=False), kernel="native") for n in (576, 192)]
    fused = FusedInt4(parts)
    assert all(p.blocks.untyped_storage().data_ptr() == fused.blocks.data_ptr() for p in parts)
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    for part, y in zip(parts, fused(x).split(fused.sizes, dim=-1), strict=True):
        assert torch.equal(y, part(x))


@needs_native
def test_a_native_head_multiplies_few_rows_in_8_bits() -> None:
    torch.manual_seed(7)
    weight = torch.randn(200, 64).to(torch.bfloat16)
    head = Int8Linear(weight, kernel="native")
    assert head.q is None and head.blocks is not None
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    want = x.float() @ weight.float().T
    assert (head(x).float() - want).abs().max() <= 0.02 * want.abs().max()


def _tiny_model() -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.mlp = torch.nn.Module()
    layer.mlp.down_proj = torch.nn.Linear(128, 64, bias=False)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer])
    model.lm_head = torch.nn.Linear(64, 48, bias=False)
    return model


def test_the_torch_kernel_is_kept_where_the_native_one_cannot_be_built(monkeypatch) -> None:
    monkeypatch.setattr(q4mm, "available", lambda: False)
    assert quant.choose_kernel(_tiny_model(), "auto") == "torch"
    with pytest.raises(ValueError, match="INT4_KERNEL=native: the 4-bit kernel could not"):
        quant.choose_kernel(_tiny_model(), "native")


def _slow_down_all_but(monkeypatch, layer_class: type, faster: str) -> None:
    """Makes `layer_class`'s calls through the other kernel than `faster` 2 ms slower."""
    real = layer_class.forward

    def forward(self, x):
        if (self.blocks is None) == (faster == "native"):  # the slower kernel's layer
            time.sleep(0.002)
        return real(self, x)

    monkeypatch.setattr(layer_class, "forward", forward)


@needs_native
@pytest.mark.parametrize("faster", ["torch", "native"])
def test_auto_keeps_the_kernel_that_multiplied_one_row_faster(monkeypatch, faster: str) -> None:
    _slow_down_all_but(monkeypatch, Int4Linear, faster)
    assert quant.choose_kernel(_tiny_model(), "auto", rounds=2) == faster
    assert quant.choose_kernel(_tiny_model(), "torch") == "torch"


@needs_native
@pytest.mark.parametrize("faster", ["torch", "native"])
def test_auto_keeps_the_head_kernel_that_multiplied_one_row_faster_apart_from_the_layers(
    monkeypatch, faster: str
) -> None:
    _slow_down_all_but(monkeypatch, Int8Linear, faster)
    assert quant.choose_head_kernel(_tiny_model(), "auto", rounds=2) == faster
    assert quant.choose_head_kernel(_tiny_model(), "torch") == "torch"
    assert quant.choose_head_kernel(_tiny_model(), "native") == "native"


def test_the_torch_head_is_kept_where_the_native_kernel_cannot_be_built(monkeypatch) -> None:
    monkeypatch.setattr(q4mm, "available", lambda: False)
    assert quant.choose_head_kernel(_tiny_model(), "auto") == "torch"
    with pytest.raises(ValueError, match="INT4_KERNEL=native"):
        quant.choose_head_kernel(_tiny_model(), "native")


@needs_native
@pytest.mark.parametrize("layers,head", [("torch", "native"), ("native", "torch")])
def test_the_layers_and_the_head_may_use_different_kernels(layers: str, head: str) -> None:
    model = quant.quantize_int4(_tiny_model(), kernel=layers, head_kernel=head)
    assert quant.kernel_of(model) == layers and quant.head_kernel_of(model) == head
    assert (model.model.layers[0].mlp.down_proj.blocks is not None) == (layers == "native")
    assert (model.lm_head.blocks is not None) == (head == "native")
    x = torch.randn(1, 2, 64, dtype=torch.bfloat16)
    want = x.float() @ model.lm_head.weight.float().T
    assert (model.lm_head(x).float() - want).abs().max() <= 0.03 * want.abs().max()


@needs_native
def test_quantizing_with_the_native_kernel_gives_every_layer_and_the_head_its_blocks() -> None:
    model = quant.quantize_int4(_tiny_model(), kernel="native")
    assert model.model.layers[0].mlp.down_proj.blocks is not None
    assert model.lm_head.blocks is not None


def test_a_failed_build_leaves_the_kernel_unavailable(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    q4mm.library.cache_clear()
    try:
        assert not q4mm.available()
    finally:
        q4mm.library.cache_clear()
