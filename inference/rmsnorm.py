"""LlamaRMSNorm of bfloat16 rows in one native call, for every path of a CPU model.

transformers' norm is nine torch calls (to float32, square, mean as a sum and a division,
add, rsqrt, multiply, back to bfloat16, times the weight), ~13 µs a norm for 1-4 rows on a
2-core AMD EPYC (Zen 5); a decode step of the bundled model makes 61 of them. Where the
native kernels are built (inference/q4mm.py), inference/rmsnorm.c does the same arithmetic in
the same dtypes in one call, its float32 sum in another order than torch's (the last bit may
differ from transformers' norm). Each row's result comes from that row alone, so a prompt's
KV does not depend on how it was chunked.

So that nothing depends on which path computed a token, install() swaps the model's own
norms for native_class()'s where the lean decode step serves it (inference/decode_step.py): its
prefill, transformers' forward and the decode step then all normalize with rms_norm(). Other
dtypes, devices or widths take transformers' calls, op for op, wherever they come from.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from inference import q4mm

_native_on = True  # tests switch it off to check the torch calls


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm.forward: x [..., dim] normalized over its last axis, times `weight`."""
    dim = x.shape[-1]
    lib = q4mm.library() if _native_on else None
    bf16 = torch.bfloat16
    if (
        lib is None
        or x.device.type != "cpu"
        or x.dtype != bf16
        or weight.dtype != bf16
        or weight.shape != (dim,)
        or dim % 8
        or x.numel() == 0
    ):
        return _torch_rms_norm(x, weight, eps)
    if not x.is_contiguous():
        x = x.contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=bf16)
    status = lib.rmsnorm(
        x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, ctypes.c_float(eps)
    )
    if status:
        raise RuntimeError(f"the native RMS norm failed ({status}) on {tuple(x.shape)}")
    return out


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # LlamaRMSNorm, op for op
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def install(model: Any) -> int:
    """Makes the model's LlamaRMSNorm modules normalize with rms_norm(); how many it swapped."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    native, swapped = native_class(), 0
    for module in model.modules():
        if type(module) is LlamaRMSNorm:
            module.__class__ = native  # the same module, weight and epsilon: only its forward
            swapped += 1
    return swapped


def is_llama_norm(module: Any) -> bool:
    """transformers' LlamaRMSNorm itself, or one install() swapped (not a subclass of it, whose
    forward may differ)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return type(module) in (LlamaRMSNorm, native_class())


@functools.cache
def native_class() -> type:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class NativeRMSNorm(LlamaRMSNorm):
        """LlamaRMSNorm whose forward is rms_norm()."""

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return rms_norm(hidden_states, self.weight, self.variance_epsilon)

    return NativeRMSNorm
