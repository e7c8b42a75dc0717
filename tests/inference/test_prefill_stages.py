"""A prefill chunk run a few layers per step: the same bits as one pass, steps within budget."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from inference import hf_prefill
from inference.chat_encoder import encode_chat
from inference.engine import Message
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
    """Its pace fixed at `per_unit` seconds a unit, and no stage cut short by the clock:
    steps are planned and run the same every run."""
    prefiller.pace.per_unit = per_unit
    prefiller.pace.record = lambda *args: None  # type: ignore[method-assign]
    prefiller.deadlines = False
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
    # unpaced (no chunks) a chunk goes through every layer at once: pace it to stage it,
    # and a prompt that fits one step goes whole (Prefiller._quick): not this one
    staged.pace.tokens, staged.pace.seconds = 10**6, 1.0
    staged._quick = lambda *args: []  # type: ignore[method-assign]
    steps, kv2, logits2 = _prefill(staged, prompt)
    layers = loaded_model.model.config.num_hidden_layers
    assert steps == math.ceil(layers / layers_per_stage) + 1  # the LM head in a stage of its own
    assert torch.equal(kv2, kv) and torch.equal(logits2, logits)


def test_a_stage_stops_between_layers_once_past_its_time_with_the_same_bits(
    loaded_model: Any,
) -> None:
    # a pace that plans every layer in one stage, and a step time that any layer outlasts:
    # each stage takes one layer, as a machine slower than its learnt pace would be cut
    prompt = _prompt(loaded_model, 0)
    prefiller = _frozen(Prefiller(loaded_model.model, 10**6, 0, step_seconds=1e-6), 1e-12)
    prefiller.deadlines = True
    prefiller._quick = lambda *args: []  # type: ignore[method-assign]
    seq, ran = _Seq(prompt), []
    original = prefiller.stages.run

    def run(staged: Any, n: int, **kwargs: Any) -> bool:
        before = staged.layer
        through = original(staged, n, **kwargs)
        ran.append((n, staged.layer - before))
        return through

    prefiller.stages.run = run  # type: ignore[method-assign]
    while not (done := prefiller.step([seq])):
        pass
    layers = loaded_model.model.config.num_hidden_layers
    assert ran[0] == (layers, 1)  # planned whole, cut after its first layer
    assert [taken for _, taken in ran] == [1] * layers + [0]  # then the LM head's own stage
    _, kv, logits = _prefill(Prefiller(loaded_model.model, 0, 0), prompt)
    assert torch.equal(done[id(seq)][0].kv, kv) and torch.equal(done[id(seq)][1], logits)


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
    chunks = sum(ran) // layers
    assert sum(ran) % layers == 0 and chunks >= len(prompt) // (
        128 * hf_prefill.MAX_STAGES_PER_CHUNK
    )
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


def _stage_shares(prefiller: Prefiller, prompt: list[int]) -> list[float]:
    """The cost, in the cost model's units, of each stage of the prompt's layers."""
    shares: list[float] = []
    original = prefiller.stages.run

    def run(staged: Any, n: int, **kwargs: Any) -> bool:
        if staged.layer < len(prefiller.stages.layers):  # not the LM head's own stage
            shares.append(prefiller.stages.share(staged, n))
        return original(staged, n, **kwargs)

    prefiller.stages.run = run  # type: ignore[method-assign]
    _prefill(prefiller, prompt)
    return shares


def test_a_chunk_in_stages_is_planned_to_fill_its_steps(loaded_model: Any) -> None:
    # planned for one step's budget, a chunk rounded up to its tile edge came out just over
    # it and went in two stages of half a step each: twice the steps, each with a decode
    # step of the running streams between them (a paste's TTFT 1.31x its unchunked one)
    prompt = _prompt(loaded_model, 0, chars=6000)
    budget = 290  # units a step: two tiles and a bit at the prompt's start
    prefiller = _frozen(Prefiller(loaded_model.model, 256, 0, step_seconds=budget / 1000), 0.001)
    shares = _stage_shares(prefiller, prompt)
    assert max(shares) <= budget  # every step within its time
    assert sum(shares[:-1]) / len(shares[:-1]) >= 0.75 * budget  # and but the last, about full


# 0.115: a tile costs 128 units, more than the step; the question's few rows do not
@pytest.mark.parametrize("step_seconds", [0.29, 0.115])
def test_a_short_prompt_admitted_during_a_chunk_in_stages_is_computed_in_the_next_step(
    loaded_model: Any, step_seconds: float
) -> None:
    # a question asked during another user's paste does not wait for the paste's chunk
    long_, short = _prompt(loaded_model, 0, chars=6000), _prompt(loaded_model, 3000, chars=200)
    assert len(short) < 128
    _, long_kv, long_logits = _prefill(Prefiller(loaded_model.model, 0, 0), long_)
    _, short_kv, short_logits = _prefill(Prefiller(loaded_model.model, 0, 0), short)
    prefiller = _frozen(Prefiller(loaded_model.model, 256, 0, step_seconds=step_seconds), 0.001)
    paste, question = _Seq(long_), _Seq(short)
    assert prefiller.step([paste]) == {} and prefiller.staged is not None
    layer = prefiller.staged.layer
    done = prefiller.step([paste, question])
    assert list(done) == [id(question)] and prefiller.staged.layer == layer  # the chunk waited
    kv, logits = done[id(question)][0].kv, done[id(question)][1]
    assert torch.equal(kv[:, :, :, : len(short)], short_kv[:, :, :, : len(short)])
    assert torch.equal(logits, short_logits)
    while not (done := prefiller.step([paste])):
        pass
    kv, logits = done[id(paste)][0].kv, done[id(paste)][1]
    assert torch.equal(kv[:, :, :, : len(long_)], long_kv[:, :, :, : len(long_)])
    assert torch.equal(logits, long_logits)


def test_one_step_at_most_goes_to_new_prompts_between_two_stages(loaded_model: Any) -> None:
    # questions arriving every step cannot hold a paste's chunk back for ever
    long_, short = _prompt(loaded_model, 0, chars=6000), _prompt(loaded_model, 3000, chars=200)
    prefiller = _frozen(Prefiller(loaded_model.model, 256, 0, step_seconds=0.29), 0.001)
    paste, first, second = _Seq(long_), _Seq(short), _Seq(short)
    assert prefiller.step([paste]) == {} and prefiller.staged is not None
    layer = prefiller.staged.layer
    assert list(prefiller.step([paste, first])) == [id(first)]
    assert prefiller.step([paste, second]) == {}  # the chunk's next stage instead
    assert prefiller.staged is None or prefiller.staged.layer > layer
    assert list(prefiller.step([paste, second])) == [id(second)]


def test_a_new_prompt_between_chunks_shares_its_step_with_the_long_prompts_next_piece(
    loaded_model: Any,
) -> None:
    long_, short = _prompt(loaded_model, 0, chars=6000), _prompt(loaded_model, 3000, chars=200)
    _, long_kv, long_logits = _prefill(Prefiller(loaded_model.model, 0, 0), long_)
    # a step whose budget has room for the question and a tile of the paste after its first
    # chunk (896 positions in 3 stages)
    prefiller = _frozen(Prefiller(loaded_model.model, 256, 0, step_seconds=0.35), 0.001)
    paste, question = _Seq(long_), _Seq(short)
    while prefiller.step([paste]) == {} and prefiller.staged is not None:
        pass  # to the end of the paste's first chunk
    job = prefiller.jobs[id(paste)]
    before = job.done
    assert prefiller.staged is None and 0 < before < len(long_)
    assert list(prefiller.step([paste, question])) == [id(question)]
    assert job.done > before and prefiller.staged is None  # in the same one-pass step
    while not (done := prefiller.step([paste])):
        pass
    assert torch.equal(done[id(paste)][0].kv[:, :, :, : len(long_)], long_kv[:, :, :, : len(long_)])
    assert torch.equal(done[id(paste)][1], long_logits)


def test_while_streams_decode_chunks_end_on_tile_edges_within_their_steps_budget(
    loaded_model: Any,
) -> None:
    from inference.prefill import ALIGN, chunk_cost

    prompt = _prompt(loaded_model, 0, chars=6000)
    budget = 150
    prefiller = _frozen(Prefiller(loaded_model.model, 256, 0, step_seconds=budget / 1000), 0.001)
    chunks, begin = [], prefiller._begin

    def planned(work: Any) -> Any:
        chunks.append((work[0][0].done + work[0][1], chunk_cost(work, prefiller.ratio)))
        return begin(work)

    prefiller._begin = planned  # type: ignore[method-assign]
    _prefill(prefiller, prompt)
    ends, costs = zip(*chunks, strict=True)
    assert len(chunks) >= 3 and all(end % ALIGN == 0 for end in ends[:-1])  # cut down, not up
    assert max(costs) <= budget * hf_prefill.MAX_STAGES_PER_CHUNK


def test_while_streams_decode_a_long_prompts_stages_fill_the_step_time(loaded_model: Any) -> None:
    """Where a tile costs just over a step (a paste's first positions), a chunk of one tile
    went in two stages of half a step each, a decode step of the running streams after each:
    the paste took ~1.4x the stages a full step each would. Chunks of a few tiles fill them."""
    from inference.prefill import chunk_cost

    prompt = _prompt(loaded_model, 0, chars=6000)
    units = 115.0  # a tile at position 0 costs 128
    prefiller = _frozen(Prefiller(loaded_model.model, 256, 0, step_seconds=units / 1000), 0.001)
    costs, begin = [], prefiller._begin

    def planned(work: Any) -> Any:
        costs.append(chunk_cost(work, prefiller.ratio))
        return begin(work)

    prefiller._begin = planned  # type: ignore[method-assign]
    steps, kv, logits = _prefill(prefiller, prompt)
    stages = steps - 1  # the last chunk's LM head takes a step of its own
    assert len(costs) >= 2 and sum(costs) / (stages * units) > 0.8
    _, one_kv, one_logits = _prefill(Prefiller(loaded_model.model, 0, 0), prompt)
    assert torch.equal(kv[:, :, :, : len(prompt)], one_kv[:, :, :, : len(prompt)])
    assert torch.equal(logits, one_logits)


def test_a_chunk_that_completes_a_question_is_the_smallest_that_does(loaded_model: Any) -> None:
    """A chunk of a few steps fills its stages better, but a question that shares it waits
    for all of them: of the chunks planned for one to four steps, the first that completes
    the question is taken."""
    from inference.prefill import chunk_cost, plan_chunk, tile_cost

    long_, short = _prompt(loaded_model, 0, chars=6000), _prompt(loaded_model, 3000, chars=200)
    units = 115.0  # a tile at position 0 costs 128: a paste's chunk alone is several tiles
    prefiller = _frozen(Prefiller(loaded_model.model, 256, 0, step_seconds=units / 1000), 0.001)
    paste = prefiller._start(_Seq(long_))
    budget = prefiller.pace.budget(tile_cost([paste], prefiller.ratio))
    alone = prefiller._fullest([paste], budget)
    assert chunk_cost(alone, prefiller.ratio) > budget
    question = prefiller._start(_Seq(short))
    shared = prefiller._fullest([paste, question], budget)
    assert dict(shared)[question] == question.remaining
    smallest = next(
        work
        for steps in range(1, hf_prefill.MAX_STAGES_PER_CHUNK + 1)
        if dict(work := plan_chunk([paste, question], budget * steps, prefiller.ratio, 1.0)).get(
            question
        )
        == question.remaining
    )
    assert shared == smallest


def test_a_prompts_progress_moves_with_each_stage_of_its_chunks(loaded_model: Any) -> None:
    prompt = _prompt(loaded_model, 0)
    prefiller = _frozen(Prefiller(loaded_model.model, 128, 0, step_seconds=0.064), 0.001)
    seq, seen, chunks = _Seq(prompt), [], 0
    while not prefiller.step([seq]):
        seen.append(prefiller.progress(seq)[2])
        chunks += prefiller.staged is None  # the step took a chunk through its last layer
    # (all of it once the last chunk is through its layers, its LM head left for a stage)
    assert seen == sorted(seen) and seen[-1] <= len(prompt)
    # it moved at the steps that ended no chunk too (each stage), not only at the chunks' ends
    assert len(set(seen)) > chunks + 1
    assert prefiller.progress(seq) is None
