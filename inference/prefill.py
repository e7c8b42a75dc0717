"""Prefill in chunks: what a step prefills, and how much fits in it.

A prompt is prefilled in chunks between decode steps, so running streams keep their pace
while it loads, and several arriving prompts share each step (shortest first). A chunk's
cost counts deep tokens for more (their attention reads every earlier key) and rows in whole
tiles; the step's budget of that cost is learnt from the steps run (StepPace), so a step
takes about PREFILL_STEP_MS whatever the CPU. The attention that keeps a chunked prompt's KV
bit for bit the KV of one whole pass is in inference/prefill_attention.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from inference import quant

# a step's fewest rows off the CPU, where a matmul of fewer may take a matrix-vector path with
# other rounding (on the CPU each matmul pads its own call: quant.invariant_linear)
MIN_ROWS = 16
ALIGN = 128  # chunks end on multiples of this: quant.TILE rows, a multiple of TILE
OVERSHOOT = 1.25  # how far past its share a chunk may run to end on an edge
MIN_BUDGET = 64.0  # cost units: smaller steps would be mostly a pass over the weights
MAX_GROWTH = 16  # the most a learnt budget may be, in PREFILL_CHUNK_TOKENS


@dataclass(eq=False)
class PrefillJob:
    """One token sequence being prefilled: a prompt (`seq` set) or a finished reply being cached."""

    tokens: list[int]
    kv: torch.Tensor  # [layers, 2, kv_heads, capacity, head_dim]; zeros past `done`
    done: int = 0  # tokens whose KV is in `kv`
    cached: int = 0  # of those, how many came from the prefix cache
    seq: Any = None
    # a prompt sent before: its last token's logits, kept from then (Prefiller.first)
    first: torch.Tensor | None = None
    # a finished reply's: tokens at its end that no request held, the next turn's markup
    # (Prefiller.finished); a next turn that parts from them still continues the reply
    guessed: int = 0

    @property
    def remaining(self) -> int:
        return len(self.tokens) - self.done


@dataclass
class Piece:
    job: PrefillJob
    start: int  # position of the first token in the sequence
    length: int
    offset: int  # where it sits in the packed row


def layer_flops_ratio(model: Any) -> float:
    """Prompt positions after which a token's attention costs as much as its linear layers.

    A token's linear layers cost 2 FLOPs per weight; its attention 4 * heads * head_dim FLOPs
    per earlier token (scores and values). Prefill chunks are sized with it (see plan_chunk)."""
    layer = model.model.layers[0] if hasattr(model, "model") else None
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    weights = (
        sum(
            m.in_features * m.out_features
            for m in layer.modules()
            # the fused 4-bit copies of q/k/v and gate/up serve decode only: not counted twice
            if hasattr(m, "in_features")
            and hasattr(m, "out_features")
            and not isinstance(m, quant.FusedInt4)
        )
        if layer
        else 0
    )
    per_key = 4 * cfg.num_attention_heads * head_dim
    return max(1.0, 2 * weights / per_key) if weights else 3000.0


def affordable(budget: float, position: int, ratio: float) -> int:
    """How many tokens from `position` on fit in `budget`, a token at p costing 1 + p / ratio."""
    if budget <= 0:
        return 0
    b = 1 + position / ratio  # n tokens cost n * b + n^2 / (2 * ratio)
    return int(ratio * (math.sqrt(b * b + 2 * budget / ratio) - b))


def _aligned(job: PrefillJob, n: int, overshoot: float = OVERSHOOT) -> int:
    """`n` moved so the chunk ends on a multiple of ALIGN positions: the linear layers multiply
    in tiles of that many rows and attention in query tiles that divide it, so a chunk ending
    mid-tile pays for that tile twice (35% more matmul rows with chunks of 256, measured). Up to
    the next edge when that is at most OVERSHOOT times `n`, else down to the last edge; as is
    when neither fits (a share smaller than a tile). Cutting only down made a deep prompt's
    chunks alternate between most of a tile and the 2 to 14 tokens left of it, each a step."""
    if n >= job.remaining:
        return n
    up = min(-(-(job.done + n) // ALIGN) * ALIGN - job.done, job.remaining)
    if up <= n * overshoot:
        return up
    down = (job.done + n) // ALIGN * ALIGN - job.done
    return down if down > 0 else n


@dataclass
class StepPace:
    """Sizes prefill steps by the time they take rather than by a fixed count of tokens.

    The cost model (1 + position / ratio per token) counts FLOPs, but what a FLOP costs differs
    by machine and by kind: torch's CPU flash attention ran at ~110 GFLOP/s on an AMD EPYC
    against ~480 on an Intel Xeon with AMX, where the matmuls differ far less. So a budget of
    tokens that keeps one machine's steps short makes another's three times as long, and
    running streams wait that long for their next token. The seconds one unit of cost took are
    learnt from the steps run (a running average of the last few large steps) and the budget
    is what fits in `seconds`; the token budget is the start, and the budget stays within
    MIN_BUDGET and MAX_GROWTH times it. How a prompt is cut never changes its KV (above)."""

    tokens: int  # PREFILL_CHUNK_TOKENS: the budget before any step is measured; 0: no chunks
    seconds: float  # PREFILL_STEP_MS / 1000; 0: `tokens` is the budget of every step
    per_unit: float = 0.0  # seconds per unit of cost, learnt

    @property
    def paced(self) -> bool:
        """Whether steps are sized by time (chunks on and a step time set)."""
        return self.tokens > 0 and self.seconds > 0

    def _learnt(self) -> bool:
        return self.paced and self.per_unit > 0

    def budget(self, floor: float = 0.0) -> float:
        """The next step's budget; a learnt one is at least `floor` (see tile_cost)."""
        if not self._learnt():
            return float(self.tokens)
        learnt = min(max(self.seconds / self.per_unit, MIN_BUDGET), self.tokens * MAX_GROWTH)
        return max(learnt, floor)

    def units_in_step(self) -> float:
        """The cost units that fit in the step time as learnt, without the budget's bounds
        (a chunk in stages is cut by layers, however few units that leaves); the token
        budget until a step is measured."""
        if not self._learnt():
            return float(self.tokens)
        return self.seconds / self.per_unit

    def record(
        self, cost: float, seconds: float, budget: float, whole_prompts: bool = False
    ) -> None:
        """A step of `cost` units took `seconds`. Not learnt from: steps well under the
        budget (a short prompt's step is mostly the fixed cost of a pass over the weights),
        and steps of `whole_prompts` only, no chunk of a longer one (a question, a next
        turn, short prompts). chunk_cost counts such a step's few rows as a whole tile, but
        where the CPU allows it (inference/narrow.py) only its own rows are multiplied: a
        5-token question during a paste taught a unit at half its price, and the paste's
        next stage ran ~180 ms where ~100 were planned (a 2-core AMD EPYC, Zen 4); the 4
        streams' short prompts had taught the paste's first stage the same way."""
        if self.seconds <= 0 or cost <= 0 or cost < budget / 2 or whole_prompts:
            return
        rate = seconds / cost
        if self.per_unit > 0:  # one descheduled step moves the estimate at most 2x
            rate = min(max(rate, self.per_unit / 2), self.per_unit * 2)
            rate = (self.per_unit + rate) / 2
        self.per_unit = rate


def chunk_cost(work: list[tuple[PrefillJob, int]], ratio: float) -> float:
    """The cost model's units for a step's pieces (a token at position 0 costs 1). The linear
    layers multiply whole tiles of ALIGN rows, so the rows count padded to one: learnt from
    unpadded counts, a step of 30 deep tokens looked four times as costly per unit as it was,
    the learnt budget shrank, and the next steps were slivers paying for whole tiles (a
    4,900-token prompt in 149 steps, 4.3x its time in one step, measured)."""
    rows = sum(n for _, n in work)
    attention = sum(n * (job.done + n / 2) / ratio for job, n in work)
    return -(-rows // ALIGN) * ALIGN + attention


def tile_cost(jobs: list[PrefillJob], ratio: float) -> float:
    """What one tile of the deepest waiting prompt costs: a step that cannot afford it would
    still pay the linear layers' whole tile, so a learnt budget is never below it."""
    deepest = max((j.done for j in jobs if j.remaining), default=0)
    return ALIGN * (1 + (deepest + ALIGN / 2) / ratio)


def plan_chunk(
    jobs: list[PrefillJob], budget: float, ratio: float, overshoot: float = OVERSHOOT
) -> list[tuple[PrefillJob, int]]:
    """Splits one step's budget fairly: shortest remaining first, each an equal share of what
    is left, so short prompts finish at once and long ones share the rest. 0: no limit.
    overshoot: how far past its share a chunk may run to end on a tile edge (_aligned)."""
    if budget <= 0:
        return [(j, j.remaining) for j in jobs if j.remaining]
    left = float(budget)
    out: list[tuple[PrefillJob, int]] = []
    todo = sorted((j for j in jobs if j.remaining), key=lambda j: j.remaining)
    for i, job in enumerate(todo):
        share = left / (len(todo) - i)
        n = _aligned(job, min(job.remaining, max(1, affordable(share, job.done, ratio))), overshoot)
        out.append((job, n))
        left -= n * (1 + (job.done + n / 2) / ratio)  # pieces share tiles: not padded here
        if left <= 0:
            break
    return out
