"""The native RMS norm: transformers' arithmetic within a rounding, each row's bits its own,
and installed so that every path of a model normalizes the same way."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from inference import q4mm, rmsnorm

pytestmark = pytest.mark.skipif(not q4mm.available(), reason="no native kernels on this machine")
BF16 = torch.bfloat16


def rows(n: int, dim: int = 576, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 1, dim, generator=gen) * scale).to(BF16)


def weight(dim: int = 576) -> torch.Tensor:
    return torch.randn(dim, generator=torch.Generator().manual_seed(1)).to(BF16)


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bfloat16 steps apart a and b are (both finite, the same sign or zero)."""
    bits = [t.view(torch.int16).to(torch.int32) & 0x7FFF for t in (a, b)]
    return (bits[0] - bits[1]).abs()


@pytest.mark.parametrize("n", [1, 4, 37])
def test_the_native_norm_is_transformers_norm_within_a_rounding(n: int) -> None:
    x, w = rows(n, seed=n), weight()
    native, torch_norm = rmsnorm.rms_norm(x, w, 1e-5), rmsnorm._torch_rms_norm(x, w, 1e-5)
    assert native.dtype == BF16 and native.shape == x.shape
    assert int(ulps(native, torch_norm).max()) <= 2
    exact = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)) * w.double()
    native_err = (native.double() - exact).abs().mean()
    torch_err = (torch_norm.double() - exact).abs().mean()
    assert native_err <= torch_err * 1.05  # as close to exact, give or take a few roundings


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it() -> None:
    x, w = rows(24), weight()
    together = rmsnorm.rms_norm(x, w, 1e-6)
    alone = torch.cat([rmsnorm.rms_norm(x[i : i + 1], w, 1e-6) for i in range(24)])
    reversed_rows = rmsnorm.rms_norm(x.flip(0), w, 1e-6).flip(0)
    assert torch.equal(together, alone) and torch.equal(together, reversed_rows)


def test_a_strided_view_gives_the_bits_of_its_contiguous_copy() -> None:
    x, w = rows(6, dim=1152), weight()
    view = x[..., :576]  # every row 1,152 apart
    assert not view.is_contiguous()
    assert torch.equal(
        rmsnorm.rms_norm(view, w, 1e-5), rmsnorm.rms_norm(view.contiguous(), w, 1e-5)
    )


def test_a_row_with_a_nan_comes_out_nan_and_leaves_the_others_alone() -> None:
    x, w = rows(3), weight()
    clean = rmsnorm.rms_norm(x, w, 1e-5)
    x[1, 0, 7] = float("nan")
    out = rmsnorm.rms_norm(x, w, 1e-5)
    assert torch.isnan(out[1]).all()
    assert torch.equal(out[0], clean[0]) and torch.equal(out[2], clean[2])


@pytest.mark.parametrize(
    ("x", "w"),
    [
        (rows(3).float(), weight()),  # float32 rows (a float32 prefill)
        (rows(3, dim=36), weight(36)),  # a width the kernel does not take
        (rows(3), weight().float()),  # a float32 weight
    ],
)
def test_what_the_kernel_does_not_take_goes_through_transformers_calls(
    x: torch.Tensor, w: torch.Tensor
) -> None:
    assert torch.equal(rmsnorm.rms_norm(x, w, 1e-5), rmsnorm._torch_rms_norm(x, w, 1e-5))


def test_switched_off_it_is_transformers_norm_op_for_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rmsnorm, "_native_on", False)
    x, w = rows(4), weight()
    assert torch.equal(rmsnorm.rms_norm(x, w, 1e-5), rmsnorm._torch_rms_norm(x, w, 1e-5))


def test_installed_the_models_norms_normalize_with_it(loaded_model: Any) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    model = loaded_model.model
    rmsnorm.install(model)
    norms = [m for m in model.modules() if isinstance(m, LlamaRMSNorm)]
    layers = model.config.num_hidden_layers
    assert len(norms) == 2 * layers + 1  # every layer's two and the final one
    assert all(type(m) is rmsnorm.native_class() for m in norms)
    assert rmsnorm.install(model) == 0  # once is enough
    x = rows(5)
    norm = model.model.layers[3].post_attention_layernorm
    assert torch.equal(norm(x), rmsnorm.rms_norm(x, norm.weight, norm.variance_epsilon))
