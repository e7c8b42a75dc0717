"""torch/transformers specifics: device, dtype, threads, loading a model folder."""

from __future__ import annotations

import os
from typing import Any

import torch

from inference.settings import Settings


def pick_device(settings: Settings) -> torch.device:
    if settings.device == "cuda" and not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(
            f"DEVICE=cuda, but torch {torch.__version__} ({build}) sees no CUDA device"
        )
    if settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def pick_dtype(settings: Settings, device: torch.device) -> torch.dtype:
    """The compute dtype (int8 computes in float32 around int8 Linear weights, int4 in bf16)."""
    if settings.dtype in ("float32", "int8"):
        return torch.float32
    if settings.dtype in ("bfloat16", "float16"):
        return getattr(torch, settings.dtype)
    if settings.dtype == "int4":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # CPU decode is memory-bandwidth bound and bf16 halves the bytes (figures: bench/README.md;
    # a 4-bit GGUF gets int4 instead: model_store.resolve_dtype).
    return torch.bfloat16


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_threads(settings: Settings) -> None:
    torch.set_num_threads(settings.threads or cpu_count())


def load_folder(folder: str, settings: Settings) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    set_threads(settings)
    device = pick_device(settings)
    if settings.dtype in ("int8", "int4") and device.type != "cpu":
        raise ValueError(f"DTYPE={settings.dtype} uses torch's CPU kernels; use bfloat16 on CUDA")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=pick_dtype(settings, device))
    model = model.to(device).eval()
    if settings.dtype == "int8":
        model = quantize_int8(model)
    elif settings.dtype == "int4":
        from inference import quant

        kernel = quant.choose_kernel(model, settings.int4_kernel)
        head = quant.choose_head_kernel(model, settings.int4_kernel)
        model = quant.quantize_int4(model, kernel=kernel, head_kernel=head)
        prefill = settings.prefill_dtype
        dense = quant.faster_dense_dtype(model) if prefill == "auto" else getattr(torch, prefill)
        quant.set_dense_dtype(model, dense)
    elif device.type == "cpu":
        from inference.quant import tile_prefill

        model = tile_prefill(model)
    return model, tok


def quantize_int8(model: Any) -> Any:
    """Dynamic int8: int8 Linear weights, activations quantized per batch row on the fly.

    It works on any batch shape, so continuous batching is unaffected. The tied embedding /
    lm_head stays float32 (quantizing it would also quantize the embedding lookup).
    """
    from torch.ao.quantization import quantize_dynamic

    layers = model.model.layers if hasattr(model, "model") else model
    quantize_dynamic(layers, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    return model
