"""Finding the model and choosing its DTYPE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inference.model_store import bundled_gguf, gguf_weight_types, resolve_dtype
from inference.settings import Settings


def test_auto_picks_int4_on_cpu_only_for_a_4bit_gguf() -> None:
    cpu = Settings(dtype="auto", device="cpu")
    assert resolve_dtype(cpu, ["Q4_1", "Q8_0"]) == "int4"
    assert resolve_dtype(cpu, ["Q8_0", "Q4_1"]) == "auto"  # mostly 8-bit: keep bfloat16
    assert resolve_dtype(cpu, []) == "auto"  # a Hugging Face folder
    assert resolve_dtype(Settings(dtype="float32", device="cpu"), ["Q4_1"]) == "float32"


@pytest.mark.model
def test_bundled_gguf_types_are_read_once_and_kept(loaded_model: Any) -> None:
    folder = Path(loaded_model.folder)
    assert gguf_weight_types(bundled_gguf(), folder)[:1] == ["Q4_1"]
    assert (folder / "tokenstream-gguf.json").is_file()
