"""A prefill chunk's forward pass, run a few decoder layers at a time.

A prefill step cannot be smaller than one tile of prefill.ALIGN rows without paying for the
whole tile (the linear layers multiply whole tiles), and deep in a long prompt that tile's
attention alone can take several times PREFILL_STEP_MS on a slow CPU. Every running stream
waited that long for its next token. So a chunk whose cost is over the step's budget goes
through the model in stages: some of its layers in one step, the next layers in the next,
a decode step of the running batch between them. Each layer does the same arithmetic on the
same rows as in one pass, in the same order, so the chunk's KV and logits are bit for bit the
one pass's (tests/inference/test_prefill_stages.py), whatever the stages.

It drives the decoder the way transformers' LlamaModel.forward does (embeddings, rotary
position embeddings, the layers, the final norm), so it serves Llama-shaped models only
(`supports`); any other model's chunk is one pass of its own forward.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch


def supports(model: Any) -> bool:
    """A Llama model: its base model's forward is embed, rotary, layers, norm and nothing else."""
    config = getattr(model, "config", None)
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    return (
        getattr(config, "model_type", None) == "llama"
        and base is not None
        and all(hasattr(base, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm"))
    )


@dataclass(eq=False)
class Staged:
    """One chunk part-way through the decoder: its hidden states after `layer` layers."""

    work: list[Any]  # (PrefillJob, tokens) of the chunk, as planned
    ending: list[Any]  # the pieces whose prompt this chunk completes (they want logits)
    keep: torch.Tensor | None  # the rows the LM head reads, or None: no logits wanted
    kwargs: dict[str, Any]  # what every layer takes besides the hidden states
    hidden: torch.Tensor
    cost: float  # the whole chunk's cost in the prefill cost model's units
    layer: int = 0
    logits: torch.Tensor | None = field(default=None, repr=False)


class StagedForward:
    """`begin` embeds a chunk, `run` takes it through the next layers, `finish` gives its
    logits: together, bit for bit `model(**inputs, logits_to_keep=keep)`."""

    def __init__(self, model: Any) -> None:
        self.model = model
        base = getattr(model, model.base_model_prefix)
        self.embed, self.rotary, self.norm = base.embed_tokens, base.rotary_emb, base.norm
        self.layers = list(base.layers[: model.config.num_hidden_layers])

    @torch.inference_mode()
    def begin(self, inputs: dict[str, Any], **chunk: Any) -> Staged:
        hidden = self.embed(inputs["input_ids"])
        kwargs = {
            "attention_mask": inputs["attention_mask"],
            "position_ids": inputs["position_ids"],
            "position_embeddings": self.rotary(hidden, position_ids=inputs["position_ids"]),
            "past_key_values": None,
            "use_cache": False,
            "prefill_plan": inputs["prefill_plan"],
        }
        return Staged(kwargs=kwargs, hidden=hidden, **chunk)

    @torch.inference_mode()
    def run(
        self, staged: Staged, layers: int, head_apart: bool = False, deadline: float | None = None
    ) -> bool:
        """The next `layers` layers (at least one); whether the chunk is through. The last
        stage also applies the final norm and, when logits are wanted, the LM head, or with
        `head_apart` leaves those to a stage of their own (the head is not in the cost
        model, and without AVX-512 it took as long as a few layers: 47 ms). `deadline`
        (time.perf_counter()): fewer layers where the next one, as long as the last, would
        end past it; the layers left go in the next stage."""
        if staged.layer == len(self.layers):  # the layers are done: the head's own stage
            return self._head(staged)
        end = min(len(self.layers), staged.layer + max(1, layers))
        hidden, index = staged.hidden, staged.layer
        while index < end:
            began = time.perf_counter()
            hidden = self.layers[index](hidden, **staged.kwargs)
            index += 1
            now = time.perf_counter()
            if deadline is not None and now + (now - began) > deadline:
                break
        staged.hidden, staged.layer = hidden, index
        if index < len(self.layers) or (head_apart and staged.keep is not None):
            return False
        return self._head(staged)

    def _head(self, staged: Staged) -> bool:
        if staged.keep is not None:
            staged.logits = self.model.lm_head(self.norm(staged.hidden)[:, staged.keep])
        return True

    def layers_within(self, staged: Staged, budget: float) -> int:
        """How many layers of `staged` its next stage takes: the fewest stages whose cost
        fits in `budget` units, their layers shared evenly (18 and 12 layers made the first
        stage half again as long as the second), at least one layer each."""
        return _layers_within(len(self.layers), staged.layer, staged.cost, budget)

    def stage_count(self, cost: float, budget: float) -> int:
        """How many stages a chunk of `cost` units takes through the layers (layers_within
        at every stage, the clock aside)."""
        total, layer, stages = len(self.layers), 0, 0
        while layer < total:
            layer += _layers_within(total, layer, cost, budget)
            stages += 1
        return stages

    def share(self, staged: Staged, layers: int) -> float:
        """The cost of `layers` of the chunk's layers."""
        return staged.cost * layers / len(self.layers)


def _layers_within(total: int, layer: int, cost: float, budget: float) -> int:
    left = total - layer
    stages = math.ceil(cost * left / total / budget) if budget > 0 else 1
    return max(1, math.ceil(left / max(1, stages)))
