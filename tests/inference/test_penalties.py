"""logit_bias and the repetition, frequency and presence penalties, each against an
independent reference on the same logits: transformers' own RepetitionPenaltyLogitsProcessor,
and OpenAI's formula computed by hand, token by token."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from inference.penalties import adjust_logits
from inference.scheduler import Sequence
from tests.support.inference_app import bare_sequence

VOCAB = 300


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


PROMPT = [5, 6, 7, 7, 8, 100]
REPLY = [7, 9, 9, 9, 200, 5, 11]


@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_repetition_penalty_is_transformers_own(penalty: float) -> None:
    logits = _logits(1)
    got = adjust_logits(logits, [bare_sequence(PROMPT, REPLY, repetition_penalty=penalty)])
    # transformers applies it over the whole input: prompt AND generated tokens
    want = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([PROMPT + REPLY]), logits.clone())
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("frequency", "presence"), [(0.5, 0.0), (0.0, 1.5), (1.0, -0.5), (-2.0, 2.0)]
)
def test_frequency_and_presence_penalties_follow_openais_formula(
    frequency: float, presence: float
) -> None:
    logits = _logits(1, seed=1)
    got = adjust_logits(
        logits,
        [bare_sequence(PROMPT, REPLY, frequency_penalty=frequency, presence_penalty=presence)],
    )
    want = logits.clone()
    for token, count in Counter(REPLY).items():  # generated tokens only: the prompt does not count
        want[0, token] -= count * frequency + (count > 0) * presence
    torch.testing.assert_close(got, want)
    assert got[0, 100] == logits[0, 100]  # in the prompt only


def test_logit_bias_adds_to_the_named_tokens_only() -> None:
    logits = _logits(1, seed=2)
    got = adjust_logits(
        logits, [bare_sequence(PROMPT, REPLY, logit_bias=((3, -100.0), (250, 7.5)))]
    )
    want = logits.clone()
    want[0, 3] += -100.0
    want[0, 250] += 7.5
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_each_row_gets_its_own_settings_and_untouched_rows_stay_bit_identical() -> None:
    logits = _logits(4, seed=3)
    seqs = [
        bare_sequence(PROMPT, REPLY, repetition_penalty=1.5),
        bare_sequence([1, 2], [3, 3]),
        bare_sequence([4], [9, 9, 10], frequency_penalty=0.8, logit_bias=((0, 2.0),)),
        bare_sequence(PROMPT, REPLY),
    ]
    got = adjust_logits(logits, seqs)
    for row, seq in enumerate(seqs):
        alone = adjust_logits(
            logits[row : row + 1], [bare_sequence(seq.prompt_ids, seq.generated, **_knobs(seq))]
        )
        assert torch.equal(got[row], alone[0].float()), row
    assert torch.equal(got[1], logits[1]) and torch.equal(got[3], logits[3])


def _knobs(seq: Sequence) -> dict[str, Any]:
    p = seq.params
    return {
        "repetition_penalty": p.repetition_penalty,
        "frequency_penalty": p.frequency_penalty,
        "presence_penalty": p.presence_penalty,
        "logit_bias": p.logit_bias,
    }


def test_no_settings_no_work() -> None:
    logits = _logits(2).to(torch.bfloat16)
    assert adjust_logits(logits, [bare_sequence(PROMPT, REPLY), bare_sequence([1], [])]) is logits


def test_counts_kept_across_steps_equal_counting_afresh() -> None:
    knobs = {"repetition_penalty": 1.2, "frequency_penalty": 0.4, "presence_penalty": 0.3}
    stepped = bare_sequence(PROMPT, [], **knobs)
    for token in REPLY:  # one decode step per token, as the scheduler appends them
        adjust_logits(_logits(1), [stepped])
        stepped.generated.append(token)
    logits = _logits(1, seed=4)
    fresh = adjust_logits(logits, [bare_sequence(PROMPT, REPLY, **knobs)])
    assert torch.equal(adjust_logits(logits, [stepped]), fresh)


def test_the_callers_logits_are_not_changed() -> None:
    logits = _logits(1)
    before = logits.clone()
    adjust_logits(
        logits, [bare_sequence(PROMPT, REPLY, repetition_penalty=1.5, logit_bias=((1, 5.0),))]
    )
    assert torch.equal(logits, before)
