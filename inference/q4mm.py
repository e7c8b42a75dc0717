"""A 4-bit matmul of our own (q4mm.c) for few-row decode, compiled for this CPU at first use.

torch's int4 CPU kernel converts every 4-bit code to float before multiplying: on a CPU
without AVX-512 (a Zen 3) that made it compute-bound at ~4 GB/s, and one stream decoded at
0.41-0.60x llama.cpp's speed. q4mm.c does what llama.cpp does for the same GGUF blocks (Q4_1):
each activation row is quantized to int8 in blocks of 32 and a block's dot product is integer
multiply-adds (AVX2; with VNNI, as on a Zen 4, one instruction where AVX2 takes two, giving
the same sums: 5-13% less time per call there). Its weights are the GGUF's own blocks: a
float16 scale and offset per 32 codes, interleaved 8 outputs at a time (`interleave`) so
that one instruction multiplies 4 codes of each of 8 outputs and a block's scales are one
vector multiply: per row, 0.45-0.64x the time of reading one output's block at a time on a
Zen 3.

It is built with the system's C compiler (`cc -O3 -march=native -fopenmp`) into a cache
folder keyed by the source, the compiler and this CPU's flags; where that fails (no compiler,
no AVX2, not x86) `available()` is False and the layers keep torch's kernel. Which kernel a
server uses is INT4_KERNEL (quant.choose_kernel times both at load under `auto`).

The same library holds inference/attend1.c, one query's attention for a decode step
(inference/attention.py uses it wherever the library is built, whichever 4-bit kernel serves).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

QK = 32  # codes per block
BLOCK_BYTES = 20  # float16 scale, float16 offset, 16 bytes of codes
GROUP = 8  # outputs whose blocks the 4-bit kernel reads interleaved (interleave)
BLOCK8_BYTES = 34  # the LM head's: float16 scale, 32 int8 codes (GGUF's Q8_0)
SOURCE = Path(__file__).with_name("q4mm.c")
# one query's attention (inference/attention.py), the RMS norm (inference/rmsnorm.py) and the
# rotary embedding (inference/rotary.py), built into the same library
SOURCES = (SOURCE, *(Path(__file__).with_name(n) for n in ("attend1.c", "rmsnorm.c", "rotary.c")))
HEADER = Path(__file__).with_name("simd.h")  # what they all include
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tokenstream" / "q4mm"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _library_path(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        "\0".join(
            [
                *(src.read_text() for src in (*SOURCES, HEADER)),
                compiler,
                version,
                " ".join(FLAGS),
                _cpu_flags(),
            ]
        ).encode()
    ).hexdigest()[:16]
    return cache_folder() / f"q4mm-{key}.so"


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # built beside its final name and renamed into place, so a concurrent loader never sees
    # half a library
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run(
            [compiler, *FLAGS, "-o", str(built), *map(str, SOURCES)],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(built, target)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be built or loaded here."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if platform.machine() not in ("x86_64", "AMD64") or not compiler:
        return None
    try:
        path = _library_path(compiler)
        if not path.exists():
            _build(compiler, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.info("the native 4-bit kernel is not available here: %s", str(detail)[-500:])
        return None
    for fn in (lib.q4mm, lib.q8mm):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 3 + [ctypes.c_void_p]
        fn.restype = ctypes.c_int
    c_long, c_ptr = ctypes.c_long, ctypes.c_void_p
    lib.attend1.argtypes = (
        [c_ptr, c_long, c_ptr, c_long, c_long, c_long, c_ptr, c_long, c_long, c_long]
        + [c_ptr, c_long, c_long, c_ptr, c_long, c_long]
        + [ctypes.c_int] * 5
        + [ctypes.c_float, c_ptr]
    )
    lib.attend1.restype = ctypes.c_int
    lib.rmsnorm.argtypes = [c_ptr, c_ptr, c_ptr, ctypes.c_int, ctypes.c_int, ctypes.c_float]
    lib.rmsnorm.restype = ctypes.c_int
    lib.rotary.argtypes = [c_ptr, c_long, c_ptr, c_ptr, c_ptr] + [ctypes.c_int] * 3
    lib.rotary.restype = ctypes.c_int
    return lib


def available() -> bool:
    return library() is not None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] weights -> their 4-bit blocks, [out, in / 32 * 20] bytes: per 32 inputs the
    group's offset (its smallest value), its scale ((largest - smallest) / 15), both float16,
    and the codes round((w - offset) / scale). For weights dequantized from a GGUF's Q4_1
    (the bundled model) these are the file's own blocks."""
    out_f, in_f = weight.shape
    if in_f % QK:
        raise ValueError(f"in_features must be a multiple of {QK}, not {in_f}")
    w = weight.detach().float().reshape(out_f, in_f // QK, QK)
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale = ((high - low) / 15).to(torch.float16)
    offset = low.to(torch.float16)
    step = scale.float()
    codes = torch.where(step > 0, (w - offset.float()) / step, torch.zeros_like(w))
    codes = codes.round().clamp(0, 15).to(torch.uint8)
    nibbles = codes[..., : QK // 2] | (codes[..., QK // 2 :] << 4)
    head = torch.cat([scale, offset], -1).view(torch.uint8)  # [out, groups, 4]
    return torch.cat([head, nibbles], -1).reshape(out_f, -1).contiguous()


def interleave(blocks: torch.Tensor) -> torch.Tensor:
    """pack's blocks in the kernel's layout, the same bytes rearranged: each GROUP outputs'
    block b side by side, their 8 float16 scales, their 8 offsets, then their codes in 4
    chunks of 32 bytes, where byte 4 * o + e of chunk c holds output o's code 4c + e in its
    low nibble and code 4c + 16 + e in its high one. One load then holds 4 codes of each of
    the 8 outputs, against 4 activations broadcast: a block's products for 8 outputs in 8
    instructions, and their scales in one multiply, where one output at a time spent most of
    its instructions on each block's scalar float work (on AVX2 the kernel was
    compute-bound). The same number of bytes as pack's."""
    out_f = blocks.shape[0]
    if out_f % GROUP:
        raise ValueError(f"out_features must be a multiple of {GROUP}, not {out_f}")
    b = blocks.reshape(out_f // GROUP, GROUP, -1, BLOCK_BYTES).transpose(1, 2)  # [G, nb, 8, 20]
    scales, offsets, nibbles = b[..., :2], b[..., 2:4], b[..., 4:]
    codes = torch.cat([nibbles & 0x0F, nibbles >> 4], -1)  # [G, nb, 8, 32]: element order
    quads = codes.reshape(*codes.shape[:3], 8, 4)  # [G, nb, 8 outputs, 8 quads, 4]
    chunks = quads[..., :4, :] | (quads[..., 4:, :] << 4)  # [G, nb, 8, 4 chunks, 4]
    parts = [scales.flatten(-2), offsets.flatten(-2), chunks.transpose(2, 3).flatten(-3)]
    return torch.cat(parts, -1).reshape(out_f, -1).contiguous()


def deinterleave(blocks: torch.Tensor) -> torch.Tensor:
    """interleave's inverse: pack's layout (for tests and checks)."""
    out_f = blocks.shape[0]
    b = blocks.reshape(out_f // GROUP, -1, GROUP * BLOCK_BYTES)  # [G, nb, 160]
    scales = b[..., :16].reshape(*b.shape[:2], GROUP, 2)
    offsets = b[..., 16:32].reshape(*b.shape[:2], GROUP, 2)
    chunks = b[..., 32:].reshape(*b.shape[:2], 4, GROUP, 4).transpose(2, 3)  # [G, nb, 8, 4, 4]
    quads = torch.cat([chunks & 0x0F, chunks >> 4], 3)  # [G, nb, 8, 8 quads, 4]
    codes = quads.reshape(*quads.shape[:3], QK)
    nibbles = codes[..., : QK // 2] | (codes[..., QK // 2 :] << 4)
    out = torch.cat([scales, offsets, nibbles], -1)  # [G, nb, 8, 20]
    return out.transpose(1, 2).reshape(out_f, -1).contiguous()


def unpack(blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """The float32 weights [out, in] that `blocks` stand for (for tests and checks)."""
    out_f = blocks.shape[0]
    b = blocks.reshape(out_f, in_features // QK, BLOCK_BYTES)
    scale, offset = b[..., :4].contiguous().view(torch.float16).float().split(1, -1)
    nibbles = b[..., 4:]
    codes = torch.cat([nibbles & 0x0F, nibbles >> 4], -1).float()
    return (codes * scale + offset).reshape(out_f, in_features)


def pack8(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] weights -> 8-bit blocks, [out, in / 32 * 34] bytes: per 32 inputs a float16
    scale (the largest magnitude / 127) and the codes round(w / scale)."""
    out_f, in_f = weight.shape
    if in_f % QK:
        raise ValueError(f"in_features must be a multiple of {QK}, not {in_f}")
    w = weight.detach().float().reshape(out_f, in_f // QK, QK)
    scale = (w.abs().amax(-1, keepdim=True) / 127).to(torch.float16)
    step = scale.float()
    codes = torch.where(step > 0, w / step, torch.zeros_like(w)).round().clamp(-127, 127)
    head = scale.view(torch.uint8)  # [out, groups, 2]
    return torch.cat([head, codes.to(torch.int8).view(torch.uint8)], -1).reshape(out_f, -1)


def unpack8(blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """The float32 weights [out, in] that pack8's `blocks` stand for."""
    b = blocks.reshape(blocks.shape[0], in_features // QK, BLOCK8_BYTES)
    scale = b[..., :2].contiguous().view(torch.float16).float()
    codes = b[..., 2:].contiguous().view(torch.int8).float()
    return (codes * scale).reshape(blocks.shape[0], in_features)


def mm(blocks: torch.Tensor, x: torch.Tensor, out_features: int) -> torch.Tensor:
    """x [rows, in] bfloat16 times 4-bit weights in interleave's layout -> [rows, out]
    bfloat16."""
    return _call(library().q4mm, blocks, x, out_features)


def mm8(blocks: torch.Tensor, x: torch.Tensor, out_features: int) -> torch.Tensor:
    """x [rows, in] bfloat16 times pack8's 8-bit weights -> [rows, out] bfloat16."""
    return _call(library().q8mm, blocks, x, out_features)


def _call(kernel: Any, blocks: torch.Tensor, x: torch.Tensor, out_features: int) -> torch.Tensor:
    if x.dtype != torch.bfloat16 or not x.is_contiguous():  # a step's 121 calls: no copy
        x = x.to(torch.bfloat16).contiguous()
    rows, in_f = x.shape
    y = torch.empty((rows, out_features), dtype=torch.bfloat16)
    status = kernel(blocks.data_ptr(), x.data_ptr(), rows, in_f, out_features, y.data_ptr())
    if status:
        raise RuntimeError(f"the native kernel failed ({status}) on [{rows}, {in_f}]")
    return y
