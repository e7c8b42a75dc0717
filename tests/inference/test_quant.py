"""DTYPE=int4: weight-only 4-bit Linear layers and how DTYPE=auto picks them."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from inference import q4mm, quant
from inference.quant import FEW_ROWS, TILE, Int4Linear, Int8Linear


def _steps(q: Int4Linear) -> torch.Tensor:
    """Each weight's quantization step (its group's scale), shaped like the weight."""
    if q.blocks is not None:
        b = q4mm.deinterleave(q.blocks).reshape(q.out_features, -1, q4mm.BLOCK_BYTES)[..., :2]
        return b.contiguous().view(torch.float16)[..., 0].float().repeat_interleave(q.group, 1)
    return q.scales_zeros[..., 0].float().T.repeat_interleave(q.group, 1)


def _int4_weights(q: Int4Linear) -> torch.Tensor:
    """The 4-bit weights as the kernel sees them (torch's kernel applied to the identity)."""
    if q.blocks is not None:
        return q4mm.unpack(q4mm.deinterleave(q.blocks), q.in_features)
    eye = torch.eye(q.in_features, dtype=torch.bfloat16)
    return (
        torch.ops.aten._weight_int4pack_mm_for_cpu(eye, q.packed, q.group, q.scales_zeros).float().T
    )


@pytest.mark.parametrize("rows", [1, FEW_ROWS, FEW_ROWS + 1, 40])
def test_int4_linear_uses_4bit_weights_for_few_rows_and_the_originals_for_many(rows: int) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 80, bias=True)
    q = Int4Linear(linear)
    x = torch.randn(1, rows, 96, dtype=torch.bfloat16)
    weights = _int4_weights(q) if rows <= FEW_ROWS else linear.weight.float()
    want = x.float() @ weights.T + linear.bias.float()
    got = q(x)
    assert got.shape == (1, rows, 80) and got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want, atol=0.02, rtol=0.01)  # the two differ by ~0.12


def test_a_prefill_rows_bits_do_not_depend_on_the_rows_beside_it() -> None:
    """A prompt's KV must be the same however its tokens were chunked or packed with others'
    (on AMX CPUs oneDNN's bf16 kernel for one row count sums in another order than for
    another: a plain F.linear fails this there)."""
    torch.manual_seed(2)
    plain = quant.tile_prefill(torch.nn.Sequential(torch.nn.Linear(576, 256).to(torch.bfloat16)))
    layers = [
        plain,
        Int4Linear(torch.nn.Linear(576, 1536, bias=True)),
        Int8Linear(torch.randn(4096, 576, dtype=torch.bfloat16)),
    ]
    x = torch.randn(3 * TILE + 37, 576, dtype=torch.bfloat16)
    with quant.dense_only():
        for layer in layers:
            whole = layer(x)
            for start, n in [(0, 16), (5, 16), (17, TILE - 1), (100, TILE + 1), (3, 2 * TILE + 9)]:
                part = layer(x[start : start + n])
                assert torch.equal(part, whole[start : start + n]), (layer, start, n)


def test_a_prefills_rows_past_its_last_whole_tile_take_the_width_the_probe_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = quant.tile_prefill(torch.nn.Sequential(torch.nn.Linear(576, 256))).to(torch.bfloat16)
    x = torch.randn(TILE + 37, 576, dtype=torch.bfloat16)
    monkeypatch.setattr(quant.narrow, "linear_rows", lambda rows, w, b, tile, packed=False: 48)
    calls: list[int] = []
    linear = quant.onednn.linear
    monkeypatch.setattr(
        quant.onednn,
        "linear",
        lambda x, w, b, packed: calls.append(x.shape[0]) or linear(x, w, b, packed),
    )
    with quant.dense_only():
        out = layer(x)
    assert calls == [TILE, 48]
    exact = torch.nn.functional.linear(x, layer[0].weight, layer[0].bias)
    assert torch.allclose(out.float(), exact.float(), atol=1e-2)


def test_float32_dense_weights_keep_a_prefill_rows_bits_and_its_dtype() -> None:
    torch.manual_seed(3)
    layer = Int4Linear(torch.nn.Linear(576, 1536, bias=True))
    model = torch.nn.Sequential(layer)
    quant.set_dense_dtype(model, torch.float32)
    assert quant.dense_dtype(model) == torch.float32
    x = torch.randn(2 * TILE + 21, 576, dtype=torch.bfloat16)
    with quant.dense_only():
        whole = layer(x)
        part = layer(x[TILE - 3 : TILE + 40])
    assert whole.dtype == torch.bfloat16 and torch.equal(part, whole[TILE - 3 : TILE + 40])
    # float32 products rounded once to bfloat16. oneDNN's packed kernel may sum in another
    # order than F.linear, so each is within float32 rounding of float64's, and the same
    # after rounding to bfloat16 but for the rare one that lies near a rounding edge
    exact = torch.nn.functional.linear(
        x.double(), layer.plain_dense().double(), layer.bias.double()
    )
    assert torch.allclose(whole.double(), exact, rtol=2**-8, atol=1e-6)
    assert (whole != exact.to(torch.bfloat16)).float().mean() < 0.01


@pytest.mark.parametrize("slow", [torch.bfloat16, torch.float32])
def test_the_faster_dense_dtype_is_the_one_that_multiplies_faster(
    monkeypatch: pytest.MonkeyPatch, slow: torch.dtype
) -> None:
    """A CPU without AMX can multiply bfloat16 slower than float32, one with AMX the other way
    round: the prefill's weights take whichever this CPU is faster at."""
    linear = quant.onednn.linear

    def timed(x: torch.Tensor, w: torch.Tensor, *rest: Any) -> torch.Tensor:
        if w.dtype == slow:
            time.sleep(0.003)
        return linear(x, w, *rest)

    monkeypatch.setattr(quant.onednn, "linear", timed)
    model = torch.nn.Sequential(Int4Linear(torch.nn.Linear(64, 128)))
    faster = torch.float32 if slow == torch.bfloat16 else torch.bfloat16
    assert quant.faster_dense_dtype(model, rounds=2) == faster
    assert quant.faster_dense_dtype(torch.nn.Sequential(torch.nn.Linear(4, 4))) == torch.bfloat16


def test_int4_rounds_each_weight_to_within_half_a_step() -> None:
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 32, bias=False)
    q = Int4Linear(linear)
    err = (_int4_weights(q) - linear.weight.float()).abs() / _steps(q)
    assert err.max() <= 0.55  # half a step, plus bf16 rounding of scale and offset
    assert err.mean() > 0.15  # arbitrary weights do not sit on a 4-bit grid


@pytest.mark.parametrize("shape", [(40, 16), (64, 100)])
def test_int4_refuses_a_shape_the_kernel_cannot_pack(shape: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="does not fit the kernel"):
        Int4Linear(torch.nn.Linear(*shape))


@pytest.mark.parametrize("rows", [1, FEW_ROWS + 3])
def test_int8_head_matches_the_float_head(rows: int) -> None:
    torch.manual_seed(2)
    weight = torch.randn(200, 64).to(torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    got = Int8Linear(weight)(x).float()
    want = x.float() @ weight.float().T
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


@pytest.mark.model
def test_bundled_model_runs_int4_holding_the_ggufs_own_4bit_codes(
    loaded_model: Any, float_model: Any
) -> None:
    """The default model is served in int4, and its int4 weights are the Q4_1 file's values:
    off by a small fraction of a step (scale and offset rounded to bf16), where re-quantizing
    arbitrary weights is off by ~a quarter of a step on average."""
    assert loaded_model.dtype == "int4"
    layers = [m for m in loaded_model.model.modules() if isinstance(m, Int4Linear)]
    assert len(layers) == 30 * 7
    for name, module in loaded_model.model.named_modules():
        if isinstance(module, Int4Linear) and name.endswith(("q_proj", "down_proj")):
            original = float_model.get_submodule(name).weight.float()
            err = (_int4_weights(module) - original).abs() / _steps(module)
            assert err.mean() < 0.05, name
    assert isinstance(loaded_model.model.lm_head, Int8Linear)


@pytest.fixture(scope="module")
def float_model(loaded_model: Any) -> Any:
    """The bundled model in float32: the GGUF's values, unrounded."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(loaded_model.folder, dtype=torch.float32)


PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, "
    "polished the great lens and wrote the weather in his log: wind from the west, a heavy swell, "
    "rain by midnight. Ships passed far out on the dark water, and each one, he liked to think, "
    "was safer because of the small light he kept burning. In the winter the storms were so "
    "strong that the whole tower shook, and waves broke over the gallery forty metres above the "
    "rocks. Still the light turned, once every ten seconds, as it had for a hundred years."
)


@pytest.mark.model
def test_int4_kernel_predicts_like_the_float32_model(
    loaded_model: Any, float_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teacher-forced over a passage, every row through the 4-bit kernel: next-token
    distributions stay within a small KL of the float32 model's (measured ~0.003 nats)."""
    import inference.quant as quant

    tok = loaded_model.tokenizer
    chat = [
        {"role": "user", "content": "Tell me about a lighthouse keeper."},
        {"role": "assistant", "content": PASSAGE},
    ]
    ids = tok.apply_chat_template(chat, return_tensors="pt", return_dict=True)["input_ids"]
    monkeypatch.setattr(quant, "FEW_ROWS", 10**9)
    with torch.inference_mode():
        ref = torch.log_softmax(float_model(input_ids=ids).logits[0].float(), -1)
        got = torch.log_softmax(loaded_model.model(input_ids=ids).logits[0].float(), -1)
    kl = (ref.exp() * (ref - got)).sum(-1).mean().item()
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert kl < 0.02 and agree > 0.9, (kl, agree)


def test_int4_refuses_a_model_it_does_not_know() -> None:
    from inference.quant import quantize_int4

    with pytest.raises(ValueError, match="DTYPE=int4 knows decoder models"):
        quantize_int4(torch.nn.Sequential(torch.nn.Linear(64, 64)))


def test_int4_quantizes_what_fits_and_leaves_the_rest_in_bfloat16() -> None:
    from inference.quant import quantize_int4

    layer = torch.nn.ModuleDict({"fits": torch.nn.Linear(64, 32), "odd": torch.nn.Linear(64, 100)})
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer])
    model.lm_head = torch.nn.Linear(64, 48, bias=False)
    quantize_int4(model)
    assert isinstance(layer["fits"], Int4Linear) and type(layer["odd"]) is quant.TiledLinear
    assert isinstance(model.lm_head, Int8Linear)


@pytest.mark.parametrize("rows", [1, 3, FEW_ROWS])
@pytest.mark.parametrize("sizes", [(576, 192, 192), (1536, 1536), (48, 32)])
def test_fused_int4_gives_the_parts_outputs_bit_for_bit(rows: int, sizes: tuple[int, ...]) -> None:
    """q/k/v (SmolLM2's shapes), gate/up, and parts that split the kernel's row blocks: one
    fused matmul, each part's slice exactly equal to that part's own output."""
    from inference.quant import FusedInt4

    torch.manual_seed(3)
    parts = [Int4Linear(torch.nn.Linear(576, n, bias=False).to(torch.bfloat16)) for n in sizes]
    fused = FusedInt4(parts)
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    got = fused(x).split(fused.sizes, dim=-1)
    for part, y in zip(parts, got, strict=True):
        assert torch.equal(y, part(x))


def test_fused_int4_shares_the_parts_packed_codes_where_the_row_blocks_allow() -> None:
    from inference.quant import FusedInt4

    torch.manual_seed(4)
    parts = [Int4Linear(torch.nn.Linear(64, n).to(torch.bfloat16)) for n in (128, 64)]
    fused = FusedInt4(parts)
    assert all(p.packed.untyped_storage().data_ptr() == fused.packed.data_ptr() for p in parts)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert torch.equal(fused(x), torch.cat([p(x) for p in parts], -1))  # biases too


def test_int4_fuses_qkv_and_gate_up_of_each_layer() -> None:
    from inference.quant import FusedInt4, quantize_int4

    def block(**names: int) -> torch.nn.Module:
        m = torch.nn.Module()
        for name, out in names.items():
            setattr(m, name, torch.nn.Linear(64, out, bias=False))
        return m

    layer = torch.nn.Module()
    layer.self_attn = block(q_proj=64, k_proj=32, v_proj=32, o_proj=64)
    layer.mlp = block(gate_proj=128, up_proj=128)
    layer.mlp.down_proj = torch.nn.Linear(128, 64, bias=False)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer])
    model.lm_head = torch.nn.Linear(64, 48, bias=False)
    quantize_int4(model)
    assert isinstance(layer.self_attn.qkv_int4, FusedInt4)
    assert layer.self_attn.qkv_int4.sizes == [64, 32, 32]
    assert isinstance(layer.mlp.gate_up_int4, FusedInt4)
    assert layer.mlp.gate_up_int4.sizes == [128, 128]


def test_a_prefills_lm_head_multiplies_its_16_rows_in_one_call(monkeypatch) -> None:
    """A prefill asks the LM head for 16 rows (quant.HEAD_TILE); padded to a whole tile of
    TILE rows they cost 8x as much (bfloat16 without AMX)."""
    head = Int8Linear(torch.randn(4096, 576, dtype=torch.bfloat16))
    calls: list[int] = []
    linear = quant.onednn.linear
    monkeypatch.setattr(
        quant.onednn,
        "linear",
        lambda x, w, b, packed: calls.append(x.shape[0]) or linear(x, w, b, packed),
    )
    with quant.dense_only():
        head(torch.randn(1, 16, 576, dtype=torch.bfloat16))
    assert calls == [16]
