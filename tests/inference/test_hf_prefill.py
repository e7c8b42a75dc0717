"""Chunked prefill and the prefix cache on the bundled model: nothing changes an answer.

Greedy replies must be token for token the same with the cache off, cold and warm, with the
prompt chunked or whole, and for a conversation's next turn built on a cached reply."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from inference.chat_encoder import ChatEncoder, encode_chat
from inference.engine import Message
from inference.hf_engine import TransformersEngine
from inference.hf_prefill import KV_TOKEN_DIM, Prefiller
from inference.prefill import OVERSHOOT
from inference.prefill_attention import ATTN_BLOCK
from inference.prefix_cache import BLOCK
from inference.scheduler import SamplingParams
from tests.support.inference_app import model_settings

pytestmark = pytest.mark.model
DOC = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
TURN1 = [Message("user", "Summarise this in one line:\n" + DOC[:2200])]
TOKENS = 24


class _Seq:
    def __init__(self, prompt: list[int]) -> None:
        self.prompt_ids, self.generated = prompt, []


def _prefill(loaded: Any, prompt: list[int], sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    pf = Prefiller(loaded.model, 0, 0)
    job = pf._start(_Seq(prompt))
    logits = None
    for n in sizes:
        logits = next(iter(pf._run([(job, n)]).values()), logits)
    assert logits is not None
    return job.kv, logits


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def prefill_dtype(request: pytest.FixtureRequest, loaded_model: Any) -> Iterator[torch.dtype]:
    """Each PREFILL_DTYPE in turn (auto picks one by the CPU), the model's own put back."""
    from inference import quant

    before = quant.dense_dtype(loaded_model.model)
    quant.set_dense_dtype(loaded_model.model, request.param)
    try:
        yield request.param
    finally:
        quant.set_dense_dtype(loaded_model.model, before)


def test_kv_bits_do_not_depend_on_the_chunks(loaded_model: Any, prefill_dtype: torch.dtype) -> None:
    prompt = encode_chat(loaded_model.tokenizer, TURN1)
    kv, logits = _prefill(loaded_model, prompt, [len(prompt)])
    rng = random.Random(0)
    sizes = [1]
    while sum(sizes) < len(prompt):
        sizes.append(min(len(prompt) - sum(sizes), rng.choice([3, 37, 100, 300])))
    kv2, logits2 = _prefill(loaded_model, prompt, sizes)
    assert torch.equal(kv2, kv) and torch.equal(logits2, logits)


def test_only_a_prompts_last_chunk_pays_for_the_lm_head(loaded_model: Any) -> None:
    calls: list[int] = []
    hook = loaded_model.model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    try:
        prompt = encode_chat(loaded_model.tokenizer, TURN1)
        _prefill(loaded_model, prompt, [128, 128, len(prompt) - 256])
    finally:
        hook.remove()
    assert len(calls) == 1


def test_a_prompts_first_logits_do_not_depend_on_the_prompts_ending_beside_it(
    loaded_model: Any, prefill_dtype: torch.dtype
) -> None:
    """The LM head takes one row per prompt that ends in the step, in a call narrowed below
    its 16-row tile only where this CPU gives each row the same bits (inference/narrow.py):
    alone, beside two others, and with every call padded to its whole tile, the same logits."""
    from inference import narrow

    tok = loaded_model.tokenizer
    prompts = [encode_chat(tok, [Message("user", q)]) for q in ("Hi!", "Name a colour.", "2+2?")]

    def first_logits(together: list[list[int]]) -> list[torch.Tensor]:
        pf = Prefiller(loaded_model.model, 0, 0)
        jobs = [pf._start(_Seq(p)) for p in together]
        done = pf._run([(job, len(job.tokens)) for job in jobs])
        return [done[job] for job in jobs]

    [alone] = first_logits(prompts[1:2])
    beside = first_logits(prompts)[1]
    narrow.enabled = False
    try:
        [padded] = first_logits(prompts[1:2])
    finally:
        narrow.enabled = True
    assert torch.equal(alone, beside) and torch.equal(alone, padded)


async def _greedy(engine: TransformersEngine, messages: list[Message]) -> list[int]:
    return (await _reply(engine, messages))[0]


async def _reply(engine: TransformersEngine, messages: list[Message]) -> tuple[list[int], str]:
    """The reply's tokens, and its text as streamed (what the site saves and sends back)."""
    gen = engine.submit(messages, SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True))
    text = "".join([getattr(ev, "text", "") async for ev in gen])
    return list(gen._seq.generated), text


async def _settled(engine: TransformersEngine) -> None:
    """Waits for the finished reply to be cached (background work of the model thread)."""
    backend: Any = engine.scheduler.backend if engine.scheduler else None
    for _ in range(600):
        if not backend.has_background():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the reply was never cached")


async def _conversation(
    loaded: Any, **settings: Any
) -> tuple[list[int], list[int], list[int], Any, int]:
    """Turn 1 twice (cold, then warm), then turn 2 on top of turn 1's reply; the cache's
    stats, and how many of turn 2's tokens came from it."""
    engine = TransformersEngine(model_settings(**settings), loaded=loaded)
    await engine.start()
    await engine.wait_ready(300)
    try:
        cold, reply = await _reply(engine, TURN1)
        await _settled(engine)
        warm = await _greedy(engine, TURN1)
        await _settled(engine)
        turn2 = [*TURN1, Message("assistant", reply), Message("user", "Shorter, please.")]
        before = engine.cache_stats().hit_tokens
        second = await _greedy(engine, turn2)
        stats = engine.cache_stats()
        return cold, warm, second, stats, stats.hit_tokens - before
    finally:
        await engine.stop()


@pytest.mark.anyio
async def test_greedy_replies_are_the_same_in_every_mode(loaded_model: Any) -> None:
    off = await _conversation(loaded_model, prefix_cache_mb=0, prefill_chunk_tokens=0)
    assert off[0] == off[1]
    for settings in (
        {"prefix_cache_mb": 64, "prefill_chunk_tokens": 0},
        {"prefix_cache_mb": 64, "prefill_chunk_tokens": 96},
        {"prefix_cache_mb": 0, "prefill_chunk_tokens": 64},
        # steps paced to take 1 ms: the learnt budget shrinks to its floor, chunk sizes vary
        {"prefix_cache_mb": 64, "prefill_chunk_tokens": 128, "prefill_step_ms": 1},
    ):
        cold, warm, second, *_ = await _conversation(loaded_model, **settings)
        assert (cold, warm, second) == off[:3], settings


def _steps(prefiller: Prefiller, prompt: list[int]) -> list[int]:
    """The tokens each prefill chunk computed for `prompt`, with no stream decoding (each
    chunk one step: planned for one step's budget, not hf_prefill.MAX_STAGES_PER_CHUNK)."""
    seq, sizes, done = _Seq(prompt), [], 0
    while not prefiller.step([seq], decoding=False):
        if prefiller.jobs[id(seq)].done > done:
            sizes.append(prefiller.jobs[id(seq)].done - done)
            done += sizes[-1]
    return [*sizes, len(prompt) - done]


def test_prefill_steps_grow_to_fill_the_step_time(loaded_model: Any) -> None:
    prompt = encode_chat(loaded_model.tokenizer, [Message("user", DOC[:2000])])
    assert 400 < len(prompt) < 64 * 16
    fixed = _steps(Prefiller(loaded_model.model, 64, 0), prompt)
    paced = _steps(Prefiller(loaded_model.model, 64, 0, step_seconds=30.0), prompt)
    assert len(fixed) >= 6 and max(fixed) <= 64 * OVERSHOOT  # to a tile edge at most
    # the first step is the token budget's; it took far less than 30 s, so the rest fits in one
    assert paced == [fixed[0], len(prompt) - fixed[0]]


def test_a_step_time_too_short_for_a_tile_still_gets_whole_tiles(loaded_model: Any) -> None:
    """On a slow CPU no tile fits the step time: smaller steps would pay the linear layers'
    whole tile anyway, so after the first (the token budget's) every step ends on a tile edge
    (the second one reaching it), and then takes a whole tile."""
    from inference.prefill import ALIGN

    prompt = encode_chat(loaded_model.tokenizer, [Message("user", DOC[:2000])])
    steps = _steps(Prefiller(loaded_model.model, 64, 0, step_seconds=0.001), prompt)
    ends = list(itertools.accumulate(steps))
    assert all(end % ALIGN == 0 for end in ends[1:-1]) and all(n == ALIGN for n in steps[2:-1])
    assert len(steps) <= len(prompt) // ALIGN + 2


@pytest.mark.anyio
async def test_the_engine_paces_prefill_steps_as_set(loaded_model: Any) -> None:
    engine = TransformersEngine(model_settings(prefill_step_ms=123), loaded=loaded_model)
    await engine.start()
    await engine.wait_ready(300)
    try:
        assert engine.scheduler.backend.prefiller.pace.seconds == pytest.approx(0.123)
    finally:
        await engine.stop()


@pytest.mark.anyio
async def test_the_next_turn_starts_after_the_cached_reply(loaded_model: Any) -> None:
    prompt1 = encode_chat(loaded_model.tokenizer, TURN1)
    *_, stats, turn2_hits = await _conversation(
        loaded_model, prefix_cache_mb=64, prefill_chunk_tokens=0
    )
    assert turn2_hits >= (len(prompt1) + TOKENS) // BLOCK * BLOCK - BLOCK  # prompt and reply
    assert turn2_hits > len(prompt1)
    assert stats.bytes <= stats.capacity_bytes


@pytest.mark.anyio
async def test_the_cache_stays_within_its_bound(loaded_model: Any) -> None:
    cold, warm, _, stats, _ = await _conversation(
        loaded_model, prefix_cache_mb=2, prefill_chunk_tokens=0
    )
    assert 0 < stats.bytes <= stats.capacity_bytes == 2 * 2**20
    assert stats.evicted_blocks > 0
    assert cold == warm


@pytest.mark.anyio
async def test_a_next_turn_sent_at_once_computes_the_reply_with_its_prompt(
    loaded_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No wait behind the reply's background caching: the next turn's prompt covers it."""
    from inference import scheduler

    monkeypatch.setattr(scheduler, "BACKGROUND_AFTER", 5.0)  # the reply is surely not cached yet
    *_, settled, _, _ = await _conversation(loaded_model, prefix_cache_mb=0, prefill_chunk_tokens=0)
    engine = TransformersEngine(model_settings(prefix_cache_mb=64), loaded=loaded_model)
    await engine.start()
    await engine.wait_ready(300)
    try:
        _, reply = await _reply(engine, TURN1)
        prefiller = engine.scheduler.backend.prefiller
        seal = prefiller.seals[-1]  # turn 1's reply waits for the model to be idle
        turn2 = [*TURN1, Message("assistant", reply), Message("user", "Shorter, please.")]
        assert await _greedy(engine, turn2) == settled
        assert seal not in prefiller.seals  # turn 2's prompt held the reply, and cached it
        hits = engine.cache_stats().hit_tokens
        assert await _greedy(engine, turn2) == settled
        prompt2 = encode_chat(loaded_model.tokenizer, turn2)
        assert engine.cache_stats().hit_tokens - hits >= (len(prompt2) - 1) // BLOCK * BLOCK
    finally:
        await engine.stop()


def test_the_chunk_cost_model_counts_each_weight_once(loaded_model: Any) -> None:
    """K = 2 * weights per layer / (4 * heads * head_dim): SmolLM2-135M has 3.54M per layer
    (q, o 576x576; k, v 192x576; gate, up, down 576x1536) and 9 heads of 64, so K = 3072."""
    from inference.prefill import layer_flops_ratio

    assert layer_flops_ratio(loaded_model.model) == pytest.approx(3072, rel=0.01)


def test_a_prompts_blocks_enter_the_cache_as_each_chunk_completes(loaded_model: Any) -> None:
    """Not all at its end: copying a long prompt's KV there held the running streams."""
    prompt = encode_chat(loaded_model.tokenizer, [Message("user", DOC[:2000])])
    prefiller = Prefiller(loaded_model.model, 128, 64 * 2**20)
    seq, cached = _Seq(prompt), []
    while not prefiller.step([seq]):
        cached.append(prefiller.stats.inserted_blocks)
        assert cached[-1] == prefiller.jobs[id(seq)].done // BLOCK  # every whole block so far
    assert len(cached) >= 3 and cached == sorted(set(cached))
    assert prefiller.stats.inserted_blocks == len(prompt) // BLOCK


def test_idle_time_probes_every_key_block_so_no_prompts_step_pays_for_one(
    loaded_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A narrow-call probe deep in a prompt took 50-75 ms, inside the step of the first prompt
    to reach that depth: a running stream's gap and a next turn's TTFT paid for it. Idle, it
    goes a slice at a time (one call each here), so a request arriving meanwhile waits for a
    slice, not for a whole probe."""
    from inference import hf_prefill, narrow

    monkeypatch.setattr(narrow, "_attention", {})
    monkeypatch.setattr(narrow, "_pending", {})
    monkeypatch.setattr(hf_prefill, "PROBE_SLICE", 0.0)
    prefiller = Prefiller(loaded_model.model, 256, 0)
    rounds = 0
    while prefiller.has_background():
        prefiller.background()
        rounds += 1
    blocks = loaded_model.model.config.max_position_embeddings // ATTN_BLOCK - 1
    assert rounds > 2 * blocks  # every block's probe took several slices
    assert not narrow._pending
    probed = dict(narrow._attention)
    assert probed  # at least the block's own (masked) call was probed
    prompt = encode_chat(loaded_model.tokenizer, [Message("user", DOC[:2200])])
    assert len(prompt) > 2 * ATTN_BLOCK  # its queries reach key blocks 1 and 2
    seq = _Seq(prompt)
    while not prefiller.step([seq]):
        pass
    assert narrow._attention == probed  # nothing was probed in the prompt's steps


def test_a_next_turn_continues_in_the_buffer_of_its_cached_reply(loaded_model: Any) -> None:
    """Its history is in place already: no fresh buffer, no copy from the cache (30-69 ms of
    a 4,000-token conversation's next turn). Another prompt leaves that buffer alone."""
    prompt = encode_chat(loaded_model.tokenizer, TURN1)
    prefiller = Prefiller(loaded_model.model, 0, 64 * 2**20)
    turn1 = _Seq(prompt)
    while not prefiller.step([turn1]):
        pass
    turn1.generated = list(range(1000, 1000 + TOKENS))  # its reply, as decoded
    prefiller.finished(turn1)
    while prefiller.has_background():
        prefiller.background()
    sealed = prefiller.sealed
    # the whole reply, its last partial block too (the cache keeps only whole blocks)
    assert sealed is not None and sealed.tokens == [*prompt, *turn1.generated]
    assert prefiller.stats.kept_bytes == sealed.kv.nbytes  # reported: it is outside the bound

    other = prefiller._start(_Seq(encode_chat(loaded_model.tokenizer, [Message("user", "Hi")])))
    assert other.kv.data_ptr() != sealed.kv.data_ptr() and prefiller.sealed is sealed
    room = sealed.kv.shape[KV_TOKEN_DIM] - len(sealed.tokens)
    too_long = prefiller._start(_Seq([*sealed.tokens, *[42] * (room + 1)]))  # a long paste
    assert too_long.kv.data_ptr() != sealed.kv.data_ptr() and prefiller.sealed is sealed
    # its history copied from the cache instead, in whole blocks
    assert too_long.done == len(sealed.tokens) // BLOCK * BLOCK

    turn2 = prefiller._start(_Seq([*prompt, *turn1.generated, 42, 43, 44]))
    assert turn2.kv.data_ptr() == sealed.kv.data_ptr() and prefiller.sealed is None
    assert prefiller.stats.kept_bytes == 0
    assert turn2.done == len(sealed.tokens)


def _sealed_turn(loaded: Any) -> tuple[Prefiller, list[int], list[int]]:
    """A prefiller holding turn 1's prompt and reply (its KV buffer kept for the next turn)."""
    prompt = encode_chat(loaded.tokenizer, TURN1)
    prefiller = Prefiller(loaded.model, 0, 64 * 2**20)
    turn1 = _Seq(prompt)
    while not prefiller.step([turn1]):
        pass
    turn1.generated = list(range(1000, 1000 + TOKENS + 5))
    assert (len(prompt) + len(turn1.generated)) % BLOCK  # its reply ends in a partial block
    prefiller.finished(turn1)
    while prefiller.has_background():
        prefiller.background()
    return prefiller, prompt, turn1.generated


@pytest.mark.parametrize("logits_kept", [True, False], ids=["logits-kept", "logits-dropped"])
def test_a_prompt_sent_again_in_the_kept_buffer_computes_at_most_its_last_token(
    loaded_model: Any, monkeypatch: pytest.MonkeyPatch, logits_kept: bool
) -> None:
    """A regenerated reply: the same prompt again, while the buffer of its first reply is
    kept. With its first reply token's logits kept from then, nothing is computed (no pass:
    ~70 ms on a 2-core AMD EPYC for the one token); without, only its last token, where the
    cache's whole blocks would leave up to 16. Either way, KV and logits are a cold
    prefill's."""
    prefiller, prompt, _ = _sealed_turn(loaded_model)
    kept_buffer = prefiller.sealed.kv.data_ptr()
    assert len(prompt) % BLOCK != 1  # the cache alone would leave more than one token
    if not logits_kept:
        prefiller.first.clear()  # as after MAX_FIRST other prompts
    seq = _Seq(list(prompt))
    job = prefiller._start(seq)
    assert job.kv.data_ptr() == kept_buffer
    assert job.done == len(prompt) - (not logits_kept)
    if logits_kept:
        monkeypatch.setattr(prefiller, "_forward", None)  # no pass may run
    _completes_as_a_cold_prefill(loaded_model, prefiller, seq, job)


def test_only_the_most_recent_prompts_logits_are_kept(loaded_model: Any) -> None:
    from inference import hf_prefill

    tok = loaded_model.tokenizer
    prefiller = Prefiller(loaded_model.model, 0, 0)
    prompts = [encode_chat(tok, [Message("user", f"Count to {n}.")]) for n in range(20)]
    for prompt in prompts:
        seq = _Seq(prompt)
        while not prefiller.step([seq]):
            pass
    assert list(prefiller.first) == [tuple(p) for p in prompts[-hf_prefill.MAX_FIRST :]]


def _completes_as_a_cold_prefill(loaded: Any, prefiller: Prefiller, seq: _Seq, job: Any) -> None:
    """The rest of `seq`'s prompt goes through; its KV and first logits are a cold prefill's."""
    done = {}
    while not done:
        done = prefiller.step([seq])
    tokens = seq.prompt_ids
    cold_kv, cold_logits = _prefill(loaded, tokens, [len(tokens)])
    n = len(tokens)
    assert torch.equal(job.kv[..., :n, :], cold_kv[..., :n, :])
    assert torch.equal(done[id(seq)][1], cold_logits)


@pytest.mark.parametrize("kept", [TOKENS + 5, TOKENS + 2], ids=["as-decoded", "retokenized"])
def test_a_next_turn_computes_only_what_follows_the_reply_it_shares(
    loaded_model: Any, kept: int
) -> None:
    """Not the reply's last partial block again, and where the next prompt tokenizes the
    reply's end otherwise than it was decoded, from where the two part; its KV and logits
    are still exactly a cold prefill's."""
    prefiller, prompt, reply = _sealed_turn(loaded_model)
    kept_buffer = prefiller.sealed.kv.data_ptr()
    turn2 = [*prompt, *reply[:kept], 7, 8, 42]
    seq = _Seq(turn2)
    job = prefiller._start(seq)
    assert job.kv.data_ptr() == kept_buffer and prefiller.sealed is None
    assert job.done == len(prompt) + kept
    _completes_as_a_cold_prefill(loaded_model, prefiller, seq, job)


@pytest.mark.parametrize("ended", [True, False], ids=["eos", "max-tokens"])
def test_a_finished_reply_is_cached_with_the_next_turns_opening_markup(
    loaded_model: Any, ended: bool
) -> None:
    """The tokens between a reply and the next question (ChatML's end of turn, a newline,
    <|im_start|>user, a newline) are the same whatever the user asks next: cached with the
    reply, the next turn computes only its question and the assistant's opening. A reply cut
    by max_tokens has no end-of-turn token of its own; the template adds it."""
    tok = loaded_model.tokenizer
    markup = ChatEncoder(tok).after_reply()
    assert tok.decode(markup) == "<|im_end|>\n<|im_start|>user\n"
    reply_text = "A summary of the notes."
    history = [*TURN1, Message("assistant", reply_text)]
    prompt = encode_chat(tok, TURN1)
    prefiller = Prefiller(loaded_model.model, 0, 64 * 2**20, after_reply=markup)
    turn1 = _Seq(prompt)
    while not prefiller.step([turn1]):
        pass
    reply = tok(reply_text, add_special_tokens=False)["input_ids"]
    turn1.generated = [*reply, markup[0]] if ended else reply
    prefiller.finished(turn1)
    while prefiller.has_background():
        prefiller.background()
    turn2 = encode_chat(tok, [*history, Message("user", "And in more detail?")])
    assert turn2[: len(prompt) + len(reply) + len(markup)] == [*prompt, *reply, *markup]
    seq = _Seq(turn2)
    job = prefiller._start(seq)
    assert job.done == len(prompt) + len(reply) + len(markup)  # all of it in place
    _completes_as_a_cold_prefill(loaded_model, prefiller, seq, job)


def test_a_next_turn_that_parts_from_its_reply_before_the_cached_markup_keeps_its_buffer(
    loaded_model: Any,
) -> None:
    """The markup cached after a reply is a guess: a next turn that tokenizes the reply's
    end otherwise parts before it, and still continues in the reply's buffer as it did
    without the markup, although the markup crosses a cache block's edge."""
    tok = loaded_model.tokenizer
    markup = ChatEncoder(tok).after_reply()
    prompt = encode_chat(tok, TURN1)
    prefiller = Prefiller(loaded_model.model, 0, 64 * 2**20, after_reply=markup)
    turn1 = _Seq(prompt)
    while not prefiller.step([turn1]):
        pass
    reply = list(range(1000, 1000 + (BLOCK - 2 - len(prompt)) % BLOCK + BLOCK))
    history = len(prompt) + len(reply)
    assert history % BLOCK + len(markup) > BLOCK  # the markup ends in the next block
    turn1.generated = reply  # cut by max_tokens: the markup starts with the end of turn
    prefiller.finished(turn1)
    while prefiller.has_background():
        prefiller.background()
    kept_buffer = prefiller.sealed.kv.data_ptr()
    seq = _Seq([*prompt, *reply[:-2], 7, 8, 42])
    job = prefiller._start(seq)
    assert job.kv.data_ptr() == kept_buffer and job.done == history - 2
    _completes_as_a_cold_prefill(loaded_model, prefiller, seq, job)
