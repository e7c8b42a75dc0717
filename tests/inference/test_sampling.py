"""Choosing tokens: temperature, top-k, min-p and top-p against transformers' own warpers on
the same logits, the shortlist against sorting the whole vocabulary, draws per request, and
logprobs of the raw distribution."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from inference.sampling import (
    CANDIDATES,
    FEW,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    candidates,
    sample,
    shortlists,
    warp,
)
from inference.sampling_params import SamplingParams
from inference.scheduler import Sequence
from tests.support.inference_app import bare_sequence

VOCAB = 1000


def _seq(**params: Any) -> Sequence:
    return bare_sequence([1, 2, 3], **params)


def _logits(rows: int, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def _hf(warpers: list[Any], logits: torch.Tensor) -> torch.Tensor:
    for w in warpers:
        logits = w(torch.zeros(1, 1, dtype=torch.long), logits)
    return logits


def _dense(shortlist: tuple[torch.Tensor | None, torch.Tensor]) -> torch.Tensor:
    ids, probs = shortlist
    dense = probs.clone() if ids is None else torch.zeros(VOCAB).index_put_((ids,), probs)
    return dense / dense.sum()


def test_top_k_is_transformers_own_per_row() -> None:
    logits = _logits(3)
    logits[0, :10] = 5.0  # a tie across the k-th: ties are kept, as in transformers
    got = apply_top_k(logits, [4, 0, 50])
    for row, k in enumerate([4, 0, 50]):
        want = (
            logits[row : row + 1]
            if k == 0
            else _hf([TopKLogitsWarper(k)], logits[row : row + 1].clone())
        )
        assert torch.equal(got[row], want[0]), row


def test_min_p_is_transformers_own_per_row() -> None:
    logits = _logits(3, seed=1)
    got = apply_min_p(logits, [0.05, 0.0, 0.3])
    for row, min_p in enumerate([0.05, 0.0, 0.3]):
        want = (
            logits[row : row + 1]
            if min_p == 0
            else _hf([MinPLogitsWarper(min_p)], logits[row : row + 1].clone())
        )
        assert torch.equal(got[row], want[0]), row


@pytest.mark.parametrize(
    ("temperature", "top_p"), [(0.5, 0.9), (1.0, 0.5), (1.3, 1.0), (0.7, 0.97)]
)
def test_temperature_and_top_p_are_transformers_own(temperature: float, top_p: float) -> None:
    logits = _logits(1, seed=2)
    params = [SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p)]
    got = _dense(candidates(warp(logits, params), params)[0])
    warpers = [TemperatureLogitsWarper(temperature)] + (
        [TopPLogitsWarper(top_p)] if top_p < 1 else []
    )
    want = torch.softmax(_hf(warpers, logits.clone()), -1)[0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("scale", [8.0, 0.3])  # peaked: the shortlist holds it; flat: it does not
def test_shortlist_equals_cutting_the_whole_sorted_vocabulary(scale: float) -> None:
    logits = _logits(2, scale=scale, seed=3)
    params = [
        SamplingParams(max_tokens=1, top_p=0.9),
        SamplingParams(max_tokens=1, top_p=0.9, top_k=CANDIDATES + 10),
    ]
    probs = warp(logits, params)
    for row, shortlist in enumerate(candidates(probs, params)):
        sorted_p, order = probs[row : row + 1].sort(descending=True)
        full = torch.zeros(VOCAB).index_put_((order[0],), apply_top_p(sorted_p, [0.9])[0])
        torch.testing.assert_close(_dense(shortlist), full / full.sum())
        if scale > 1:
            assert int((_dense(shortlist) > 0).sum()) < CANDIDATES


FLOORED = [
    SamplingParams(max_tokens=1, temperature=0.5, top_p=0.9, min_p=0.1),  # the site's cuts
    SamplingParams(max_tokens=1, temperature=1.0, top_k=40),
    SamplingParams(max_tokens=1, temperature=0.8, top_k=CANDIDATES + 44, min_p=0.05),
    SamplingParams(max_tokens=1, temperature=1.2, top_k=5, min_p=0.02, top_p=0.8),
]


@pytest.mark.parametrize(
    ("scale", "lengths"),  # how many highest logits each row's cut was placed on
    [
        (8.0, [FEW, CANDIDATES, FEW, FEW]),  # peaked: a handful past the min-p floor
        (1.0, [FEW, CANDIDATES, CANDIDATES, FEW]),
        (0.3, [VOCAB, CANDIDATES, VOCAB, FEW]),  # flat: min-p keeps hundreds
    ],
)
def test_floor_cuts_on_the_highest_logits_equal_cutting_the_whole_vocabulary(
    scale: float, lengths: list[int]
) -> None:
    logits = _logits(len(FLOORED), scale=scale, seed=3)
    got = shortlists(logits, FLOORED)
    want = candidates(warp(logits, FLOORED), FLOORED)
    for row, (mine, whole) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(_dense(mine), _dense(whole))
        assert len(mine[1]) == lengths[row], row


def test_a_seeded_request_draws_the_same_whatever_shares_its_batch() -> None:
    knobs = {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "min_p": 0.02, "seed": 7}
    logits = _logits(3, seed=4)
    logits[1] = logits[0]  # the seeded request's row, alone at 0 and crowded at 1

    def draws(rows: list[Sequence], row: int) -> list[int]:
        return [sample(logits[: len(rows)], rows)[row].token for _ in range(20)]

    alone = draws([_seq(**knobs)], 0)
    assert len(set(alone)) > 1  # it does sample
    crowded = draws(
        [_seq(temperature=1.0), _seq(**knobs), _seq(temperature=0, repetition_penalty=1.5)], 1
    )
    assert crowded == alone


def test_draws_follow_the_cut_distribution() -> None:
    logits = torch.full((1, VOCAB), -20.0)
    logits[0, [3, 4, 5]] = torch.tensor([2.0, 1.0, 0.5])
    seq = _seq(temperature=1.0, top_k=2, seed=0)
    counts = torch.bincount(
        torch.tensor([sample(logits, [seq])[0].token for _ in range(600)]), minlength=6
    )
    assert counts[5] == 0 and counts.sum() == counts[3] + counts[4]  # top-k 2 cut the third
    assert abs(counts[3] / 600 - torch.sigmoid(torch.tensor(1.0))) < 0.07  # e^2 / (e^2 + e^1)


def test_greedy_rows_take_the_argmax_after_penalties() -> None:
    logits = _logits(1, seed=5)
    best = int(logits.argmax())
    assert sample(logits, [_seq(temperature=0)])[0].token == best
    banned = _seq(temperature=0, logit_bias=((best, -100.0),))
    assert sample(logits, [banned])[0].token == int(
        logits[0].clone().index_fill_(0, torch.tensor(best), -1e9).argmax()
    )


def test_logprobs_are_the_raw_distributions_whatever_the_knobs() -> None:
    logits = _logits(3, seed=6)
    seqs = [
        _seq(temperature=0.3, top_k=5, repetition_penalty=1.4, logprobs=True, top_logprobs=4),
        _seq(temperature=0),
        _seq(temperature=0, logprobs=True),
    ]
    out = sample(logits, seqs)
    raw = torch.log_softmax(logits, -1)
    first = out[0]
    assert first.logprob == pytest.approx(float(raw[0, first.token]))
    top_lp, top_ids = raw[0].topk(4)
    assert [t for t, _ in first.top] == top_ids.tolist()
    assert [lp for _, lp in first.top] == pytest.approx(top_lp.tolist())
    assert out[1].logprob is None and out[1].top == ()
    assert out[2].logprob == pytest.approx(float(raw[2].max())) and out[2].top == ()


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="no CUDA device on this machine"
            ),
        ),
    ],
)
def test_the_same_choices_on_every_device(device: str) -> None:
    """Device-agnostic tensor code: greedy choices after bias and penalties, logprobs and
    seeded draws do not depend on where the logits are."""
    logits = _logits(4, seed=7)

    def run(on: str) -> list[Any]:
        seqs = [
            _seq(
                temperature=0,
                repetition_penalty=1.3,
                frequency_penalty=0.5,
                logprobs=True,
                top_logprobs=2,
            ),
            _seq(temperature=0, logit_bias=((int(logits[1].argmax()), -100.0),)),
            _seq(temperature=0.8, top_k=20, min_p=0.02, top_p=0.9, seed=5),
            _seq(temperature=0),
        ]
        for seq in seqs:
            seq.generated = [1, 5, 5, 9]
        return sample(logits.to(on), seqs)

    cpu, other = run("cpu"), run(device)
    assert [s.token for s in other] == [s.token for s in cpu]
    assert other[0].logprob == pytest.approx(cpu[0].logprob, abs=1e-5)
