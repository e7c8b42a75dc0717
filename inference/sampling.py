"""Choosing each row's next token, per request inside the batch (meanings in sampling_params).

In vLLM's order: logprobs are read from the raw logits first; then logit_bias and the
penalties (inference.penalties); then temperature 0 takes the argmax, and any other
temperature divides the logits, min-p, top-k and top-p cut the distribution, and the token
is drawn with the request's own torch.Generator (seeded when the request gives a seed), so
one request's draw never depends on what else is in the batch. Every step is vectorised
over the rows that use it and skipped when none does; only the draw itself is per row.
"""

from __future__ import annotations

import torch

from inference.penalties import adjust_logits
from inference.sampling_params import Sampled, SamplingParams
from inference.scheduler import Sequence

RawLogprobs = tuple[list[int], torch.Tensor]  # rows that asked, their log-softmax [R, V]
# Sampling cuts (top-p 0.9 at temperature 0.5, top-k 40, min-p) keep far fewer tokens than this.
CANDIDATES = 256
# A min-p cut at the site's defaults keeps a handful: a top-k this small costs a third of 256's.
FEW = 16


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[Sampled]:
    """logits: [B, V] for the last position of each sequence, in `seqs` order."""
    raw = raw_logprobs(logits, seqs)
    logits = adjust_logits(logits, seqs).float()  # float32: bf16's argmax is slower on CPU
    drawn = [r for r, s in enumerate(seqs) if not s.params.greedy]
    tokens = [0] * len(seqs)
    # each pass over [rows, vocab] costs ~0.5 ms a step at 8 rows: only the rows that need it
    greedy = [r for r, s in enumerate(seqs) if s.params.greedy]
    for r, token in zip(greedy, _rows(logits, greedy, len(seqs)).argmax(-1).tolist(), strict=True):
        tokens[r] = token
    if drawn:
        params = [seqs[r].params for r in drawn]
        for r, (ids, probs) in zip(
            drawn, shortlists(_rows(logits, drawn, len(seqs)), params), strict=True
        ):
            tokens[r] = draw(ids, probs, _generator(seqs[r]))
    return with_logprobs(tokens, raw, seqs)


def _rows(logits: torch.Tensor, rows: list[int], total: int) -> torch.Tensor:
    if len(rows) == total:
        return logits
    return logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=logits.device))


def shortlists(logits: torch.Tensor, params: list[SamplingParams]) -> list[Shortlist]:
    """[R, V] float32 logits of sampled rows -> each row's tokens that can be drawn.

    A min-p or top-k cut is a floor on the logits: a row whose floor cuts the least of its k
    highest logits cuts everything beyond them too, so temperature, the cuts, the softmax and
    top-p need those k alone. Tried with FEW, then CANDIDATES, each row taking the first that
    holds its cut; the rest (top-p alone, or a flat distribution) take the whole vocabulary.
    This spares the passes over the vocabulary that cost the most of a sampled step."""
    out: list[Shortlist | None] = [None] * len(params)
    for k in (FEW, CANDIDATES):
        rows = [i for i, p in enumerate(params) if out[i] is None and p.floors]
        if rows:
            cut = _floored(_pick(logits, rows), [params[i] for i in rows], k)
            for i, shortlist in zip(rows, cut, strict=True):
                out[i] = shortlist
    rest = [i for i, s in enumerate(out) if s is None]
    if rest:
        some = [params[i] for i in rest]
        whole = candidates(warp(_pick(logits, rest), some), some)
        for i, shortlist in zip(rest, whole, strict=True):
            out[i] = shortlist
    return [s for s in out if s is not None]


def _floored(logits: torch.Tensor, params: list[SamplingParams], k: int) -> list[Shortlist | None]:
    """Rows cut on their k highest logits (None where the cut reaches past them)."""
    top, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)  # sorted, highest first
    x = top / _column(top, [p.temperature for p in params])
    x = x.masked_fill(x < _floor(x, params), float("-inf"))
    held = (x[:, -1] == float("-inf")) | (top.shape[-1] == logits.shape[-1])
    probs = apply_top_p(torch.softmax(x, dim=-1), [p.top_p for p in params]).cpu()
    ids = ids.cpu()
    return [(ids[j], probs[j]) if ok else None for j, ok in enumerate(held.tolist())]


def _floor(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[R, 1]: the higher of each row's min-p floor and its k-th logit (-inf for neither, and
    for a k past the shortlist, whose cut the shortlist cannot place)."""
    min_p = _column(x, [p.min_p for p in params])
    floor = torch.where(min_p > 0, x[:, :1] + torch.log(min_p), float("-inf"))
    k = [p.top_k if 0 < p.top_k <= x.shape[-1] else 0 for p in params]
    if any(k):
        kth = x.gather(1, torch.tensor([max(n - 1, 0) for n in k], device=x.device)[:, None])
        kth = torch.where(torch.tensor(k, device=x.device)[:, None] > 0, kth, float("-inf"))
        floor = torch.maximum(floor, kth)
    return floor


def _pick(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    return _rows(logits, rows, logits.shape[0])


def warp(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[R, V] float32 logits of sampled rows -> probabilities after temperature, min-p, top-k."""
    x = logits / _column(logits, [p.temperature for p in params])
    if any(p.min_p > 0 for p in params):
        x = apply_min_p(x, [p.min_p for p in params])
    if any(p.top_k > 0 for p in params):
        x = apply_top_k(x, [p.top_k for p in params])
    return torch.softmax(x, dim=-1)


def apply_min_p(logits: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Tokens less likely than min_p x the row's most likely token's probability -> -inf.

    Compared as logits (p < min_p * p_max is x < x_max + ln(min_p): the softmax's shared
    denominator cancels), which spares a softmax over the vocabulary each step."""
    floor = logits.amax(dim=-1, keepdim=True) + torch.log(_column(logits, min_p))
    return logits.masked_fill(logits < floor, float("-inf"))


def apply_top_k(logits: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """All but each row's k highest logits (ties with the k-th kept) -> -inf; k <= 0: row kept."""
    k_max = min(max(top_k), logits.shape[-1])
    kth = logits.topk(k_max, dim=-1).values
    index = torch.tensor([min(k, k_max) - 1 if k > 0 else 0 for k in top_k], device=logits.device)
    floor = kth.gather(1, index[:, None])
    off = torch.tensor([k <= 0 for k in top_k], device=logits.device)[:, None]
    return logits.masked_fill((logits < floor) & ~off, float("-inf"))


def apply_top_p(sorted_probs: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """[R, K] probabilities sorted most likely first -> zero past each row's smallest prefix
    whose mass reaches top_p (the first always stays; top_p 1 keeps the row)."""
    limit = _column(sorted_probs, top_p)
    drop = (sorted_probs.cumsum(-1) - sorted_probs > limit) & (limit < 1)
    return sorted_probs.masked_fill(drop, 0.0)


Shortlist = tuple[
    torch.Tensor | None, torch.Tensor
]  # (token ids or None: all, their probs), on CPU


def candidates(probs: torch.Tensor, params: list[SamplingParams]) -> list[Shortlist]:
    """Each row's tokens that can be drawn. A row that cuts its distribution keeps few tokens:
    its CANDIDATES most likely ones hold them all unless the distribution is very flat (then
    the whole vocabulary is sorted, for those rows only), which spares sorting V tokens."""
    cut = [i for i, p in enumerate(params) if p.truncates]
    whole = probs.cpu()
    out: list[Shortlist] = [(None, whole[i]) for i in range(len(params))]
    if not cut:
        return out
    sub = probs.index_select(0, torch.tensor(cut, device=probs.device))
    top_p = [params[i].top_p for i in cut]
    kept, ids = sub.topk(min(CANDIDATES, sub.shape[-1]), dim=-1)
    limit = _column(sub, top_p)
    beyond = (kept[:, -1] > 0) & ((limit >= 1) | (kept.sum(-1, keepdim=True) <= limit).squeeze(-1))
    if bool(beyond.any()):
        kept, ids = sub.sort(dim=-1, descending=True)
    kept, ids = apply_top_p(kept, top_p).cpu(), ids.cpu()
    for j, i in enumerate(cut):
        out[i] = (ids[j], kept[j])
    return out


def draw(ids: torch.Tensor | None, probs: torch.Tensor, generator: torch.Generator) -> int:
    """Inverse-CDF draw: one uniform from the request's generator, however many candidates."""
    cdf = probs.cumsum(0)
    u = torch.rand(1, generator=generator, dtype=cdf.dtype) * cdf[-1]
    i = min(int(torch.searchsorted(cdf, u, right=True)), len(cdf) - 1)
    return i if ids is None else int(ids[i])


def raw_logprobs(logits: torch.Tensor, seqs: list[Sequence]) -> RawLogprobs | None:
    rows = [r for r, s in enumerate(seqs) if s.params.logprobs]
    if not rows:
        return None
    picked = logits.index_select(0, torch.tensor(rows, device=logits.device))
    return rows, torch.log_softmax(picked.float(), dim=-1)


def with_logprobs(
    tokens: list[int], raw: RawLogprobs | None, seqs: list[Sequence]
) -> list[Sampled]:
    out = [Sampled(t) for t in tokens]
    if raw is None:
        return out
    rows, logprobs = raw
    chosen_ids = torch.tensor([tokens[r] for r in rows], device=logprobs.device)
    chosen = logprobs.gather(1, chosen_ids[:, None]).squeeze(1).tolist()
    k = max(seqs[r].params.top_logprobs for r in rows)
    top = logprobs.topk(k, dim=-1)  # k = 0 gives empty rows
    top_lp, top_ids = top.values.tolist(), top.indices.tolist()
    for i, r in enumerate(rows):
        n = seqs[r].params.top_logprobs
        out[r] = Sampled(
            tokens[r], chosen[i], tuple(zip(top_ids[i][:n], top_lp[i][:n], strict=True))
        )
    return out


def _column(x: torch.Tensor, values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=x.device)[:, None]


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
