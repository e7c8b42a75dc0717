"""What one request asks of the sampler, and what the sampler hands back per token.

Each field's meaning is the reference's, so a client written for that API gets what it
expects; `inference.sampling` applies them, per request, inside the continuous batch.
Torch-free, so the fake engine and the HTTP layer can use it without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    # OpenAI: logits are divided by it; 0 means greedy (argmax), as vLLM does.
    temperature: float = 1.0
    # OpenAI / HF TopPLogitsWarper: sample from the smallest set of most likely tokens whose
    # probability mass reaches top_p (the most likely token always stays). 1 = off.
    top_p: float = 1.0
    # vLLM / HF TopKLogitsWarper: only the k most likely tokens (ties at the k-th kept). 0 = off.
    top_k: int = 0
    # vLLM / HF MinPLogitsWarper: drop tokens less likely than min_p times the most likely
    # token's probability (after temperature). 0 = off.
    min_p: float = 0.0
    # OpenAI (platform.openai.com/docs/advanced-usage, "frequency and presence penalties"):
    #   logit[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty
    # where count[t] is how often t was GENERATED so far in this reply (the prompt does not
    # count), as vLLM computes it. -2..2, 0 = off.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # vLLM / HF RepetitionPenaltyLogitsProcessor (CTRL, Keskar et al. 2019): for every token in
    # the prompt OR generated so far, a positive logit is divided by it, a negative one
    # multiplied. >0, 1 = off.
    repetition_penalty: float = 1.0
    # OpenAI: (token id, bias) pairs, the bias (-100..100) added to that token's logit before
    # sampling; -100 in effect bans it, 100 in effect forces it.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # OpenAI: report each generated token's log probability, and the top_logprobs (0..20)
    # most likely tokens at each position. They are vLLM's default logprobs_mode,
    # "raw_logprobs": the model's own distribution, BEFORE penalties, bias, temperature and
    # top-k/top-p/min-p, so they say what the model thought, whatever the knobs did.
    logprobs: bool = False
    top_logprobs: int = 0
    seed: int | None = None  # OpenAI: the same seed and parameters give the same reply
    stop: tuple[str, ...] = ()  # OpenAI: the reply ends before the first of these strings
    ignore_eos: bool = False  # vLLM's extension: benchmarks and tests need exact lengths
    # llama.cpp server's extension (a stream only): how far the prompt's prefill has got,
    # reported between its steps, so a client can show progress on a long paste
    return_progress: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Needs the tokens seen so far (the costly part: skipped for rows that do not)."""
        return (
            self.repetition_penalty != 1
            or self.frequency_penalty != 0
            or self.presence_penalty != 0
        )

    @property
    def adjusts_logits(self) -> bool:
        """Changes the logits before the greedy/sampling choice (so it matters even at temperature 0)."""
        return self.penalized or bool(self.logit_bias)

    @property
    def floors(self) -> bool:
        """Cuts by a floor on the logits (min-p, top-k), which a shortlist of them can place."""
        return self.min_p > 0 or self.top_k > 0

    @property
    def truncates(self) -> bool:
        """Cuts the distribution before sampling (no effect on greedy rows)."""
        return self.top_p < 1 or self.top_k > 0 or self.min_p > 0


@dataclass(frozen=True, slots=True)
class Sampled:
    """One chosen token; logprob and top (token id, logprob) pairs when the request asked."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's logprob as the API reports it: the token's own bytes, not ids."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()
