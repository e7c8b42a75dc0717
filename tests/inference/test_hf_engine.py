"""The transformers backend with the real bundled model, driven step by step (no scheduler
thread, so which requests share a step is fixed): one request's sampling settings never
reach another's, in the same batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inference.chat_encoder import encode_chat
from inference.engine import Message
from inference.hf_engine import TransformersBackend, TransformersEngine, eos_ids
from inference.sampling_params import SamplingParams
from inference.scheduler import Sequence
from inference.textstream import IncrementalDetokenizer
from tests.support.inference_app import greedy_sequence, model_settings

pytestmark = pytest.mark.model
PROMPT = "List the planets of the solar system, one per line, and say one thing about each."
TOKENS = 24


def _generate(loaded: Any, settings: list[dict[str, Any]]) -> list[list[int]]:
    """Runs these requests as one batch, from one prefill to the last decode step."""
    backend = TransformersBackend(loaded.model, eos_ids(loaded.model, loaded.tokenizer))
    prompt = encode_chat(loaded.tokenizer, [Message("user", PROMPT)])
    seqs = [
        Sequence(
            prompt,
            SamplingParams(max_tokens=TOKENS, **knobs),
            IncrementalDetokenizer(loaded.tokenizer),
            asyncio.Queue(),
        )
        for knobs in settings
    ]
    running, step = list(seqs), backend.prefill
    while running:
        for seq, sampled in zip(running, step(running), strict=True):
            seq.accept(sampled, backend.is_eos(sampled.token), 0.0)
        if done := [s for s in running if s.done]:
            backend.release(done)
            running = [s for s in running if not s.done]
        step = backend.decode
    return [s.generated for s in seqs]


def test_a_mixed_batch_gives_each_request_what_it_gets_alone(loaded_model: Any) -> None:
    plain = {"temperature": 0}
    first = _generate(loaded_model, [plain])[0][0]
    settings = [
        plain,
        {"temperature": 0, "repetition_penalty": 1.3},
        {"temperature": 0, "frequency_penalty": 1.0, "presence_penalty": 0.5},
        {"temperature": 0, "logit_bias": ((first, -100.0),)},
        {"temperature": 0, "logprobs": True, "top_logprobs": 3, "repetition_penalty": 0.9},
        {"temperature": 0.8, "top_k": 40, "min_p": 0.05, "top_p": 0.95, "seed": 11},
    ]
    together = _generate(loaded_model, settings)
    alone = [_generate(loaded_model, [knobs])[0] for knobs in settings]
    assert together == alone
    # The repetition penalty, the bias and sampling changed the reply (none was a no-op).
    # Row 2's frequency/presence penalties act only once a token repeats, which greedy
    # decoding may not do in 24 tokens, and row 4's repetition_penalty 0.9 favours what
    # greedy already picks: their effect is checked against references in test_sampling.py.
    for row in (1, 3, 5):
        assert together[row] != together[0], settings[row]
    assert together[3][0] != first


def _greedy_alone(loaded: Any, decode_threads: int | None, seen: list[int]) -> list[int]:
    """One greedy stream; `seen` gets the torch thread count of each of its decode steps."""
    import torch

    backend = TransformersBackend(
        loaded.model, eos_ids(loaded.model, loaded.tokenizer), decode_threads=decode_threads
    )
    forward = backend._forward
    backend._forward = lambda *a: (seen.append(torch.get_num_threads()), forward(*a))[1]
    seq = greedy_sequence(loaded, PROMPT, TOKENS)
    step = backend.prefill
    for _ in range(TOKENS):
        seq.generated.append(step([seq])[0].token)
        step = backend.decode
    backend.release([seq])
    return seq.generated


def test_a_lone_stream_decodes_on_decode_threads_with_the_same_answer(loaded_model: Any) -> None:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        one: list[int] = []
        two: list[int] = []
        head: list[int] = []
        hook = loaded_model.model.lm_head.register_forward_pre_hook(
            lambda *_: head.append(torch.get_num_threads())
        )
        try:
            lone = _greedy_alone(loaded_model, 1, one)
        finally:
            hook.remove()
        assert lone == _greedy_alone(loaded_model, 0, two)
        assert set(one) == {1} and set(two) == {2}
        auto: list[int] = []  # DECODE_THREADS=auto: timed on both counts, same answer
        assert lone == _greedy_alone(loaded_model, None, auto)
        assert set(auto) == {1, 2}
        # the LM head, one large call, on every thread (the prefill's head call too)
        assert head and set(head) == {2}
        assert torch.get_num_threads() == 2  # restored for prefill and batches
    finally:
        torch.set_num_threads(before)


def _staggered(loaded: Any, backend: TransformersBackend, prompts: list[str]) -> list[list[int]]:
    """Greedy replies of `prompts`, each joining the batch 3 decode steps after the one before."""
    seqs = [greedy_sequence(loaded, p, TOKENS) for p in prompts]
    running: list[Sequence] = []
    for step in range(TOKENS + 3 * len(seqs)):
        if step % 3 == 0 and seqs[len(running) :]:
            new = seqs[len(running)]
            new.generated.append(backend.prefill([new])[0].token)
            running.append(new)
        live = [s for s in running if len(s.generated) < TOKENS]
        for seq, sampled in zip(live, backend.decode(live) if live else [], strict=True):
            seq.generated.append(sampled.token)
        if done := [s for s in live if len(s.generated) == TOKENS]:
            backend.release(done)
    return [s.generated for s in seqs]


def test_a_long_prompt_beside_short_ones_decodes_in_its_own_group_with_the_same_answers(
    loaded_model: Any,
) -> None:
    from pathlib import Path

    from inference import batch

    notes = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()[:4000]
    prompts = [PROMPT, f"Summarize these notes in one line:\n{notes}", "Hi! Who are you?"]
    backend = TransformersBackend(
        loaded_model.model, eos_ids(loaded_model.model, loaded_model.tokenizer)
    )
    groups: list[int] = []
    decode = backend.decode
    backend.decode = lambda seqs: (groups.append(len(backend.batch.groups)), decode(seqs))[1]
    together = _staggered(loaded_model, backend, prompts)
    long = len(encode_chat(loaded_model.tokenizer, [Message("user", prompts[1])]))
    assert long > batch.SPLIT + 100 and max(groups) == 2  # the long one had a group to itself
    alone = [_staggered(loaded_model, backend, [p])[0] for p in prompts]
    assert together == alone


def test_the_engine_caches_each_reply_with_its_templates_next_turn_markup(
    loaded_model: Any,
) -> None:
    engine = TransformersEngine(model_settings(), loaded=loaded_model)
    engine._load()
    markup = engine._backend().prefiller.after_reply
    assert markup and markup == engine.encoder.after_reply()


def _progress_until_first_token(backend: TransformersBackend, seq: Sequence) -> list[tuple]:
    """prompt_progress after each prefill step of `seq` that did not finish its prompt."""
    seen = []
    while backend.prefill([seq])[0] is None:
        seen.append(backend.prompt_progress(seq))
    assert backend.prompt_progress(seq) is None  # done: nothing left to report
    return seen


def test_a_long_prompts_progress_climbs_to_its_first_token_and_counts_the_cache(
    loaded_model: Any,
) -> None:
    backend = TransformersBackend(
        loaded_model.model,
        eos_ids(loaded_model.model, loaded_model.tokenizer),
        chunk_tokens=128,
        cache_bytes=64 << 20,
    )
    first = " ".join(f"Note {i}: the river rose again overnight." for i in range(60))
    seq = greedy_sequence(loaded_model, first, 1)
    seen = _progress_until_first_token(backend, seq)
    total = len(seq.prompt_ids)
    assert len(seen) >= 3 and {s[:2] for s in seen} == {(total, 0)}
    done = [s[2] for s in seen]
    assert done == sorted(set(done)) and done[0] > 0 and done[-1] < total
    # a longer prompt that starts with it: its progress starts from the cached blocks
    longer = first + " " + " ".join(f"Later {i}: the bridge held." for i in range(60))
    again = greedy_sequence(loaded_model, longer, 1)
    seen = _progress_until_first_token(backend, again)
    cached = {s[1] for s in seen}
    assert len(cached) == 1 and 0 < cached.pop() <= len(seq.prompt_ids) <= seen[0][2]
