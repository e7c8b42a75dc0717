"""A prefill chunk run a few layers per step: the same bits as one pass, steps within budget."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from inference.engine import Message
from inference.hf_engine import encode_chat
from inference.hf_prefill import Prefiller
from inference.prefill_stages import supports

pytestmark = pytest.mark.model
DOC = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()


class _Seq:
    def __init__(self, prompt: list[int]) -> None:
        self.prompt_ids, self.generated = prompt, []


def _prompt(loaded: Any, start: int, chars: int = 2400) -> list[int]:
    return encode_chat(loaded.tokenizer, [Message("user", DOC[start : start + chars])])


def _frozen(prefiller: Prefiller, per_unit: float) -> Prefiller:
    """Its pace fixed at `per_unit` seconds a unit: steps are planned the same every run."""
    prefiller.pace.per_unit = per_unit
    prefiller.pace.record = lambda *args: None  # type: ignore[method-assign]
    return prefiller


def _prefill(prefiller: Prefiller, prompt: list[int]) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Steps until the prompt is computed: how many, its KV, its last position's logits."""
    seq, steps = _Seq(prompt), 1
    while not (done := prefiller.step([seq])):
        steps += 1
    job, logits = done[id(seq)]
    return steps, job.kv, logits


@pytest.mark.parametrize("layers_per_stage", [1, 7])
def test_a_chunk_in_stages_has_the_bits_of_the_models_own_forward(
    loaded_model: Any, layers_per_stage: int
) -> None:
    prompt = _prompt(loaded_model, 0)
    one_pass = Prefiller(loaded_model.model, 0, 0)
    one_pass.stages = None  # transformers' own forward, in one call
    _, kv, logits = _prefill(one_pass, prompt)
    staged = Prefiller(loaded_model.model, 0, 0)
    staged.stages.layers_within = lambda *args: layers_per_stage  # type: ignore[method-assign]
    # unpaced (no chunks) a chunk goes through every layer at once: pace it to stage it
    staged.pace.tokens, staged.pace.seconds = 10**6, 1.0
    steps, kv2, logits2 = _prefill(staged, prompt)
    layers = loaded_model.model.config.num_hidden_layers
    assert steps == math.ceil(layers / layers_per_stage) + 1  # the LM head in a stage of its own
    assert torch.equal(kv2, kv) and torch.equal(logits2, logits)


def test_a_deep_chunk_over_the_step_budget_takes_several_steps_of_fewer_layers(
    loaded_model: Any,
) -> None:
    prompt = _prompt(loaded_model, 0)
    layers = loaded_model.model.config.num_hidden_layers
    # a budget of 64 units, the least a learnt one can be, under a tile's 128 rows
    prefiller = _frozen(Prefiller(loaded_model.model, 128, 0, step_seconds=0.064), 0.001)
    seq, ran = _Seq(prompt), []
    original = prefiller.stages.run

    def run(staged: Any, n: int, **kwargs: Any) -> bool:
        ran.append(min(n, layers - staged.layer))
        return original(staged, n, **kwargs)

    prefiller.stages.run = run  # type: ignore[method-assign]
    while not (done := prefiller.step([seq])):
        pass
    assert sum(ran) % layers == 0 and sum(ran) // layers >= len(prompt) // 128
    assert max(ran) < layers  # no step took a chunk through every layer
    _, kv, logits = _prefill(Prefiller(loaded_model.model, 0, 0), prompt)
    assert torch.equal(done[id(seq)][0].kv, kv) and torch.equal(done[id(seq)][1], logits)


def test_with_no_stream_decoding_a_chunk_over_the_step_budget_goes_through_whole(
    loaded_model: Any,
) -> None:
    # stages only make room for running streams' decode steps; alone they are overhead
    # (a next turn deep in a conversation took 3 steps, 114 + 70 + 8 ms, instead of one)
    prompt = _prompt(loaded_model, 0)
    prefiller = _frozen(Prefiller(loaded_model.model, 128, 0, step_seconds=0.064), 0.001)
    seq, steps = _Seq(prompt), 1
    while not (done := prefiller.step([seq], decoding=False)):
        steps += 1
        assert prefiller.staged is None  # never left part-way through the layers
    assert steps == math.ceil(len(prompt) / 128)  # one step a chunk, its head within it
    _, kv, logits = _prefill(Prefiller(loaded_model.model, 0, 0), prompt)
    assert torch.equal(done[id(seq)][0].kv, kv) and torch.equal(done[id(seq)][1], logits)


def test_a_chunk_begun_in_stages_ends_whole_once_no_stream_is_decoding(
    loaded_model: Any,
) -> None:
    prompt = _prompt(loaded_model, 0, chars=300)
    prefiller = _frozen(Prefiller(loaded_model.model, 128, 0, step_seconds=0.064), 0.001)
    seq = _Seq(prompt)
    assert prefiller.step([seq]) == {} and prefiller.staged is not None
    done = prefiller.step([seq], decoding=False)  # the rest of its layers and its head
    _, kv, logits = _prefill(Prefiller(loaded_model.model, 0, 0), prompt)
    assert torch.equal(done[id(seq)][0].kv, kv) and torch.equal(done[id(seq)][1], logits)


def test_a_prompt_cancelled_between_stages_leaves_the_next_one_its_own_answer(
    loaded_model: Any,
) -> None:
    first, second = _prompt(loaded_model, 0), _prompt(loaded_model, 3000)
    _, kv, logits = _prefill(Prefiller(loaded_model.model, 0, 0), second)
    prefiller = _frozen(Prefiller(loaded_model.model, 256, 0, step_seconds=0.064), 0.001)
    gone = _Seq(first)
    assert prefiller.step([gone]) == {} and prefiller.staged is not None
    prefiller.finished(gone)  # cancelled: the scheduler releases it
    _, kv2, logits2 = _prefill(prefiller, second)
    assert torch.equal(kv2[:, :, :, : len(second)], kv[:, :, :, : len(second)])
    assert torch.equal(logits2, logits)


def test_only_llama_shaped_models_are_staged() -> None:
    base = SimpleNamespace(embed_tokens=1, rotary_emb=1, layers=[], norm=1)
    llama = SimpleNamespace(config=SimpleNamespace(model_type="llama"), base_model_prefix="model")
    llama.model = base
    gemma = SimpleNamespace(config=SimpleNamespace(model_type="gemma"), base_model_prefix="model")
    gemma.model = base
    assert supports(llama) and not supports(gemma)


def test_a_chunks_layers_are_shared_evenly_by_its_stages(loaded_model: Any) -> None:
    stages = Prefiller(loaded_model.model, 0, 0).stages
    staged = SimpleNamespace(cost=300.0, layer=0)
    layers = len(stages.layers)
    assert stages.layers_within(staged, 300.0) == layers  # fits: one stage
    assert stages.layers_within(staged, 180.0) == math.ceil(layers / 2)  # 15 and 15, not 18
    staged.layer = layers - 3
    assert stages.layers_within(staged, 1.0) == 1  # never less than a layer


def test_a_prompts_last_chunk_in_stages_takes_its_lm_head_in_a_stage_of_its_own(
    loaded_model: Any,
) -> None:
    prompt = _prompt(loaded_model, 0, chars=300)
    prefiller = _frozen(Prefiller(loaded_model.model, 128, 0, step_seconds=0.064), 0.001)
    calls: list[str] = []
    hooks = [
        loaded_model.model.lm_head.register_forward_hook(lambda *_: calls.append("head")),
        prefiller.stages.layers[-1].register_forward_hook(lambda *_: calls.append("last layer")),
    ]
    seq, steps = _Seq(prompt), [calls]
    try:
        while not prefiller.step([seq]):
            steps.append(calls := [])
    finally:
        for hook in hooks:
            hook.remove()
    assert len(steps) > 2 and steps[-2:] == [["last layer"], ["head"]]
