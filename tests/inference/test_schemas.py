"""The request body -> the sampler's parameters: OpenAI's and vLLM's defaults and spellings."""

from __future__ import annotations

from typing import Any

from inference.sampling_params import SamplingParams
from inference.schemas import ChatCompletionRequest

MESSAGES = [{"role": "user", "content": "hi"}]


def _request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **fields)


def test_absent_or_null_fields_mean_the_defaults() -> None:
    nulls = {
        name: None
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
            "logit_bias",
            "logprobs",
            "top_logprobs",
        )
    }
    assert _request().sampling(7) == _request(**nulls).sampling(7) == SamplingParams(max_tokens=7)


def test_every_field_reaches_the_sampler() -> None:
    params = _request(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={"7": -100, "42": 3.5},
        logprobs=True,
        top_logprobs=5,
        seed=3,
        stop="END",
        ignore_eos=True,
    ).sampling(9)
    assert params == SamplingParams(
        max_tokens=9,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias=((7, -100.0), (42, 3.5)),
        logprobs=True,
        top_logprobs=5,
        seed=3,
        stop=("END",),
        ignore_eos=True,
    )


def test_top_k_minus_one_is_off_like_zero() -> None:
    assert _request(top_k=-1).sampling(1).top_k == 0 == _request(top_k=0).sampling(1).top_k


def test_what_the_sampler_skips() -> None:
    assert not SamplingParams(max_tokens=1).adjusts_logits
    assert SamplingParams(max_tokens=1, logit_bias=((1, 1.0),)).adjusts_logits
    assert SamplingParams(max_tokens=1, presence_penalty=0.1).penalized
    assert not SamplingParams(max_tokens=1, top_k=0, top_p=1, min_p=0).truncates
