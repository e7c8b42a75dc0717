"""The lean decode step: the model's own logits, bit for bit, and the same greedy replies."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from inference.decode_step import DecodeStep, supports
from inference.hf_engine import TransformersBackend, eos_ids
from inference.scheduler import Sequence
from tests.support.inference_app import greedy_sequence

pytestmark = pytest.mark.model
PROMPTS = [
    "List the planets of the solar system, one per line.",
    "Hi!",
    "Write a short poem about the sea, then explain what it means in two sentences.",
    "What is 17 times 23?",
]
TOKENS = 24


def _sequences(loaded: Any, prompts: list[str]) -> list[Sequence]:
    return [greedy_sequence(loaded, p, TOKENS) for p in prompts]


def _greedy(loaded: Any, prompts: list[str], lean: bool) -> list[list[int]]:
    """Greedy replies of these prompts as one batch, the lean step on or off."""
    backend = TransformersBackend(loaded.model, eos_ids(loaded.model, loaded.tokenizer))
    assert backend.fast is not None  # the bundled model is int4 Llama: the lean step serves it
    if not lean:
        backend.fast = None
    seqs = _sequences(loaded, prompts)
    step = backend.prefill
    for _ in range(TOKENS):
        for seq, sampled in zip(seqs, step(seqs), strict=True):
            seq.generated.append(sampled.token)
        step = backend.decode
    backend.release(seqs)
    return [s.generated for s in seqs]


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS[2:3], PROMPTS])
def test_greedy_replies_are_the_same_tokens_with_the_lean_step(
    model_of_each_kernel: Any, prompts: list[str]
) -> None:
    """One stream, and a batch of prompts of different lengths (left padding, a mask), through
    either 4-bit kernel."""
    loaded = model_of_each_kernel
    assert _greedy(loaded, prompts, lean=True) == _greedy(loaded, prompts, lean=False)


def _bit_for_bit(loaded: Any, prompts: list[str]) -> None:
    """One lean step over the batch of `prompts` (one group) against the model's forward."""
    backend = TransformersBackend(loaded.model, eos_ids(loaded.model, loaded.tokenizer))
    seqs = _sequences(loaded, prompts)
    for seq, sampled in zip(seqs, backend.prefill(seqs), strict=True):
        seq.generated.append(sampled.token)
    (g,) = backend.batch.groups
    ids = torch.tensor([[s.generated[-1]] for s in g.rows])
    mask = torch.cat([g.mask, g.mask.new_ones((len(seqs), 1))], dim=1)
    theirs_cache, ours_cache = copy.deepcopy(g.cache), copy.deepcopy(g.cache)
    theirs = loaded.model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=g.pos[:, None],
        past_key_values=theirs_cache,
        use_cache=True,
    ).logits
    ours = DecodeStep(loaded.model).step(ids, g.pos[:, None], [(mask, ours_cache)])
    backend.release(seqs)
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    for a, c in zip(ours_cache.layers, theirs_cache.layers, strict=True):
        assert torch.equal(a.keys, c.keys) and torch.equal(a.values, c.values)


@torch.inference_mode()
def test_a_step_gives_the_models_logits_and_kv_bit_for_bit(model_of_each_kernel: Any) -> None:
    _bit_for_bit(model_of_each_kernel, PROMPTS)


@torch.inference_mode()
def test_a_step_of_many_rows_gives_the_models_logits_bit_for_bit(loaded_model: Any) -> None:
    """Past quant.FEW_ROWS rows the projections take their bfloat16 weights, as the model's."""
    from inference import quant

    prompts = (PROMPTS * 3)[: quant.FEW_ROWS + 2]
    _bit_for_bit(loaded_model, prompts)


def test_the_lean_step_leaves_prefill_to_the_model(loaded_model: Any) -> None:
    from inference import quant

    step = DecodeStep(loaded_model.model)
    assert step.handles(1) and step.handles(quant.FEW_ROWS + 1)
    with quant.dense_only():
        assert not step.handles(1)


def test_only_int4_llama_models_get_the_lean_step(loaded_model: Any) -> None:
    assert supports(loaded_model.model)
    plain = torch.nn.Module()
    plain.config = copy.copy(loaded_model.model.config)
    plain.config.model_type = "qwen3"
    assert not supports(plain)


def test_a_model_whose_norm_is_not_transformers_own_keeps_its_forward(
    loaded_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step normalizes with inference/rmsnorm.py, which computes LlamaRMSNorm: a norm
    that overrides it would give the step other logits than the model's forward."""

    class ScaledNorm(type(loaded_model.model.model.norm)):
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return super().forward(hidden_states) * 2

    layer = loaded_model.model.model.layers[7]
    monkeypatch.setattr(layer.post_attention_layernorm, "__class__", ScaledNorm)
    assert not supports(loaded_model.model)
