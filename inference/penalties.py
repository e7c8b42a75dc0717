"""What changes the logits before any choice, greedy or sampled: logit_bias, then the
repetition, frequency and presence penalties (vLLM's order; meanings in sampling_params).

They touch only the rows that ask for them, and nothing runs when no row does. The
penalties touch only the tokens a sequence has seen, not the whole vocabulary: each
sequence keeps its distinct tokens (and how often it generated each) in small index buffers
that grow by its new token each step, and one gather/scatter over all rows applies them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from inference.scheduler import Sequence


class _Growable:
    """A 1-D tensor appended to in place (amortised O(1)); `view` is what is filled so far."""

    def __init__(self, dtype: torch.dtype, values: list[int | float]) -> None:
        self._data = torch.tensor(values or [0], dtype=dtype)
        self.n = len(values)

    def append(self, value: int | float) -> None:
        if self.n == len(self._data):
            self._data = torch.cat([self._data, torch.zeros_like(self._data)])
        self._data[self.n] = value
        self.n += 1

    def add_at(self, i: int, value: float) -> None:
        self._data[i] += value

    def view(self) -> torch.Tensor:
        return self._data[: self.n]


class SeenTokens:
    """One sequence's distinct tokens so far (prompt and reply), and how often it generated each."""

    def __init__(self, prompt_ids: list[int]) -> None:
        distinct = list(dict.fromkeys(prompt_ids))
        self.distinct = _Growable(torch.long, distinct)
        self._distinct = set(distinct)
        self.generated = _Growable(torch.long, [])
        self.counts = _Growable(torch.float32, [])
        self._position: dict[int, int] = {}  # token -> its index in generated/counts
        self._counted = 0  # tokens of the reply already in the buffers

    def update(self, generated: list[int]) -> None:
        for token in generated[self._counted :]:
            if token not in self._distinct:
                self._distinct.add(token)
                self.distinct.append(token)
            if token in self._position:
                self.counts.add_at(self._position[token], 1.0)
            else:
                self._position[token] = self.generated.n
                self.generated.append(token)
                self.counts.append(1.0)
        self._counted = len(generated)


def seen_tokens(seq: Sequence) -> SeenTokens:
    seen = seq.state.get("seen")
    if seen is None:
        seen = seq.state["seen"] = SeenTokens(seq.prompt_ids)
    seen.update(seq.generated)
    return seen


def adjust_logits(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """logits [B, V] of `seqs`' rows -> a float32 copy with each row's bias and penalties;
    the same tensor when no row has any."""
    if not any(s.params.adjusts_logits for s in seqs):
        return logits
    logits = logits.to(torch.float32, copy=True).contiguous()
    biased = [r for r, s in enumerate(seqs) if s.params.logit_bias]
    if biased:
        add_logit_bias(logits, biased, [seqs[r] for r in biased])
    penalized = [r for r, s in enumerate(seqs) if s.params.penalized]
    if penalized:
        penalize(logits, penalized, [seqs[r] for r in penalized])
    return logits


def add_logit_bias(logits: torch.Tensor, rows: list[int], seqs: list[Sequence]) -> None:
    """In place: OpenAI's logit_bias, each listed token's bias added to its row."""
    pairs = [
        (row, token, bias) for row, s in zip(rows, seqs) for token, bias in s.params.logit_bias
    ]
    row_ids, token_ids, biases = zip(*pairs)
    device = logits.device
    logits.index_put_(
        (torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device)),
        torch.tensor(biases, dtype=logits.dtype, device=device),
        accumulate=True,
    )


def penalize(logits: torch.Tensor, rows: list[int], seqs: list[Sequence]) -> None:
    """In place, on contiguous float32 [B, V] logits: the repetition, frequency and presence
    penalties of `seqs`, which sit at `rows`."""
    seen = [seen_tokens(s) for s in seqs]
    flat, vocab, device = logits.view(-1), logits.shape[-1], logits.device
    repeated = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1]
    if repeated:
        at, spread = _flat_index(
            [rows[i] for i in repeated], [seen[i].distinct.view() for i in repeated], vocab, device
        )
        penalty = spread([seqs[i].params.repetition_penalty for i in repeated])
        values = flat[at]
        # HF RepetitionPenaltyLogitsProcessor's arithmetic
        flat[at] = torch.where(values < 0, values * penalty, values / penalty)
    counted = [
        i for i, s in enumerate(seqs) if s.params.frequency_penalty or s.params.presence_penalty
    ]
    if counted:
        at, spread = _flat_index(
            [rows[i] for i in counted], [seen[i].generated.view() for i in counted], vocab, device
        )
        counts = torch.cat([seen[i].counts.view() for i in counted]).to(device)
        frequency = spread([seqs[i].params.frequency_penalty for i in counted])
        presence = spread([seqs[i].params.presence_penalty for i in counted])
        flat[at] -= counts * frequency + presence  # only tokens generated at least once are listed


def _flat_index(
    rows: list[int], tokens: list[torch.Tensor], vocab: int, device: torch.device
) -> tuple[torch.Tensor, Callable[[list[float]], torch.Tensor]]:
    """Where each row's tokens sit in the flattened [B, V] logits, and a function spreading
    one value per row over that row's tokens."""
    at = torch.cat([t + row * vocab for row, t in zip(rows, tokens, strict=True)]).to(device)
    lengths = torch.tensor([len(t) for t in tokens])

    def spread(per_row: list[float]) -> torch.Tensor:
        return torch.tensor(per_row, dtype=torch.float32).repeat_interleave(lengths).to(device)

    return at, spread
