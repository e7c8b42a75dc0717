"""Where and how the model runs: device checks before anything is loaded."""

from __future__ import annotations

import pytest
import torch

from inference.settings import Settings


def test_int4_is_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from inference.hf_runtime import load_folder

    # refused before anything is loaded, so a stand-in for the GPU is enough
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="CPU kernels"):
        load_folder("unused", Settings(dtype="int4", device="cuda"))


def test_device_cuda_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from inference.hf_runtime import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="DEVICE=cuda, but torch .* sees no CUDA device"):
        pick_device(Settings(device="cuda"))
    assert pick_device(Settings(device="auto")).type == "cpu"
