"""transformers' own continuous batching manager, measured in-process like our engine's
in-process rows (`bench.inference --hf-manager` runs it beside our server).

    .venv/bin/python -m bench.hf_manager    # rows for N = 1 and 8, 32 new tokens
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from math import ceil
from typing import Any

from bench.measure import HEADER, PROMPTS, Result
from inference.model_store import LoadedModel

# Smaller than transformers' default of 256 so the cache holds about what the requests need.
PAGE_SIZE = 32


def run_hf_manager(loaded: LoadedModel, n: int, tokens: int) -> Result:
    tok = loaded.tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            add_generation_prompt=True,
            return_dict=True,
        )["input_ids"]
        for i in range(n)
    ]
    with started_manager(loaded.model, prompts, tokens) as manager:
        # like our engine's start-up: one short generation first, so the rows pay no first-call costs
        manager.add_request(prompts[0], request_id="warmup", max_new_tokens=2)
        while (out := manager.get_result(timeout=120)) is not None and not out.is_finished():
            pass
        return measure(manager, prompts, tokens)


@contextmanager
def started_manager(model: Any, prompts: list[list[int]], tokens: int) -> Iterator[Any]:
    """A fresh manager sized for these requests; the model is left as it was found."""
    import torch
    from transformers import ContinuousBatchingConfig

    n = len(prompts)
    gen = copy.deepcopy(model.generation_config)
    # eos -1: the manager ignores negative ids, so every request runs to max_new_tokens
    gen.update(do_sample=False, eos_token_id=-1, max_new_tokens=tokens)
    cb = ContinuousBatchingConfig(
        page_size=PAGE_SIZE,
        # unset, the cache is sized from 60% of RAM on CPU; this is room for all n requests, whole
        num_blocks=n * ceil((max(map(len, prompts)) + tokens) / PAGE_SIZE),
        # all prompts fit in one step, so every prefill happens in the first forward
        max_batch_tokens=sum(map(len, prompts)),
        max_requests_per_batch=n,
        # the prompts share the system prompt: prefix reuse would skip prefill work our engine does
        allow_block_sharing=False,
        seed=0,
    )
    attn = model.config._attn_implementation
    rng = torch.random.get_rng_state()  # the manager reseeds torch's global generator
    # a cached manager would be reused with its own (old) sizes
    model.destroy_cached_continuous_batching_manager()
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    try:
        yield manager
    finally:
        manager.stop(
            block=True, timeout=60
        )  # also restores the attention implementation it switched
        manager.destroy()
        model.destroy_cached_continuous_batching_manager()
        if model.config._attn_implementation != attn:
            model.set_attn_implementation(attn)
        torch.random.set_rng_state(rng)


def measure(manager: Any, prompts: list[list[int]], tokens: int) -> Result:
    res = Result()
    t0 = time.monotonic()
    ids = [
        manager.add_request(p, request_id=f"r{i}", max_new_tokens=tokens, streaming=True)
        for i, p in enumerate(prompts)
    ]
    seen = {rid: 0 for rid in ids if rid is not None}  # generated tokens so far
    last: dict[str, float] = {}
    finished = 0
    while finished < len(seen):
        out = manager.get_result(timeout=1)  # the single consumer of the shared output queue
        if out is None:
            if not manager.is_running():
                break
            continue
        if out.request_id not in seen:  # a late warm-up output
            continue
        now = time.monotonic()
        # streamed outputs carry the cumulative list of generated tokens, not a delta
        got = len(out.generated_tokens)
        if got > seen[out.request_id]:
            prev = last.get(out.request_id)
            (res.ttft if prev is None else res.itl).append(now - (t0 if prev is None else prev))
            last[out.request_id] = now
            seen[out.request_id] = got
        if out.is_finished():
            finished += 1
            res.failures += out.error is not None or got < tokens
    res.wall = time.monotonic() - t0
    res.tokens = sum(seen.values())
    res.failures += len(prompts) - finished  # dropped at submission, or never finished
    return res


def main() -> None:
    from inference.model_store import prepare_model
    from inference.settings import Settings

    loaded = prepare_model(Settings(model="", dtype="bfloat16", device="cpu"))
    print(HEADER)
    for n in (1, 8):
        print(run_hf_manager(loaded, n, 32).row("transformers CB manager", n), flush=True)


if __name__ == "__main__":
    main()
