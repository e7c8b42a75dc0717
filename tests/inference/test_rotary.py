"""The native rotary embedding gives torch's bits, wherever its inputs lie."""

from __future__ import annotations

import pytest
import torch

from inference import q4mm, rotary

pytestmark = pytest.mark.skipif(not q4mm.available(), reason="no native kernels on this machine")
BF16 = torch.bfloat16


def angles(b: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    theta = torch.rand(b, 1, 1, dim, generator=gen) * 1000
    return theta.cos().to(BF16), theta.sin().to(BF16)


@pytest.mark.parametrize(("b", "heads"), [(1, 12), (4, 12), (3, 9), (7, 3)])
@pytest.mark.parametrize("scale", [1.0, 1e-30, 1e30])
def test_rotated_heads_are_torchs_bit_for_bit(b: int, heads: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(b * heads)
    # as a decode step has them: q and k side by side in the fused projection's output
    fused = (torch.randn(b, 1, heads + 3, 64, generator=gen) * scale).to(BF16).transpose(1, 2)
    x = fused[:, :heads]
    cos, sin = angles(b, 64, heads)
    native = rotary.rotate(x, cos, sin)
    assert native.shape == (b, heads, 1, 64)
    assert torch.equal(native, rotary.torch_rotate(x, cos, sin))


def test_infinities_and_nans_come_out_as_torchs() -> None:
    x = torch.randn(2, 4, 1, 64).to(BF16)
    x[0, 1, 0, 3], x[1, 2, 0, 40], x[1, 0, 0, 0] = float("inf"), float("nan"), float("-inf")
    cos, sin = angles(2, 64, 0)
    native, reference = rotary.rotate(x, cos, sin), rotary.torch_rotate(x, cos, sin)
    assert torch.equal(native.isnan(), reference.isnan())
    assert torch.equal(native.nan_to_num(0.0), reference.nan_to_num(0.0))


@pytest.mark.parametrize(
    "case",
    ["float32", "two positions", "width 40"],
)
def test_what_the_kernel_does_not_take_goes_through_torchs_calls(case: str) -> None:
    x, (cos, sin) = torch.randn(2, 3, 1, 64).to(BF16), angles(2, 64, 1)
    if case == "float32":
        x, cos, sin = x.float(), cos.float(), sin.float()
    elif case == "two positions":
        x = torch.randn(2, 3, 2, 64).to(BF16)
    else:
        x, (cos, sin) = torch.randn(2, 3, 1, 40).to(BF16), angles(2, 40, 1)
    assert torch.equal(rotary.rotate(x, cos, sin), rotary.torch_rotate(x, cos, sin))
