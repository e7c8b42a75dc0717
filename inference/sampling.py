"""Per-request sampling: greedy for temperature 0, else temperature + top-p with the
request's own torch.Generator (seeded when the request gives a seed), so one request's
seed never depends on what else is in the batch."""

from __future__ import annotations

import torch

from inference.scheduler import Sequence


def _generator(seq: Sequence) -> torch.Generator:
    gen = seq.state.get("generator")
    if gen is None:
        gen = torch.Generator(device="cpu")
        if seq.params.seed is not None:
            gen.manual_seed(seq.params.seed)
        else:
            gen.seed()
        seq.state["generator"] = gen
    return gen


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(descending=True)
    # keep the smallest set whose mass reaches top_p (the first token always stays)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    sorted_p[drop] = 0.0
    return torch.zeros_like(probs).scatter(-1, order, sorted_p)


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """logits: [B, V] for the last position of each sequence, in `seqs` order."""
    greedy = logits.argmax(-1).tolist()
    if all(s.params.temperature == 0 for s in seqs):
        return greedy
    # Sampling on CPU in float32: one generator type on every device, cheap for B x V.
    cpu = logits.float().cpu()
    out: list[int] = []
    for row, seq in enumerate(seqs):
        if seq.params.temperature == 0:
            out.append(greedy[row])
            continue
        probs = torch.softmax(cpu[row] / seq.params.temperature, dim=-1)
        probs = _top_p(probs, seq.params.top_p)
        out.append(int(torch.multinomial(probs, 1, generator=_generator(seq))))
    return out
