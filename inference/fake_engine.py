"""ENGINE=fake: no model. Streams the words of the last user message back, one token per
word (with its leading space), at FAKE_TOKENS_PER_SECOND, then stops: for tests, demos on
tiny machines and load tests of everything around the model. Never imports torch.

A prompt (one token per word of every message) is prefilled in one step, or with
FAKE_PREFILL_TOKENS_PER_SECOND in chunks of PREFILL_CHUNK words at that pace, so a long
paste takes a while and reports its progress, as the real engine's does."""

from __future__ import annotations

import re
import time

from inference.engine import Engine, Message
from inference.sampling_params import Sampled
from inference.scheduler import Sequence
from inference.settings import Settings

WORD = re.compile(r"\s*\S+")


class WordDetokenizer:
    def __init__(self, words: list[str]) -> None:
        self._words = words

    def push(self, token_id: int) -> str:
        return self._words[token_id]

    def flush(self) -> str:
        return ""

    def token_bytes(self, token_id: int) -> bytes:
        return self._words[token_id].encode()


PREFILL_CHUNK = 64  # prompt words a paced fake prefill step computes, per prompt


class FakeBackend:
    """Token i of a sequence is word i of its last user message; then end of sequence."""

    EOS = -1

    def __init__(self, tokens_per_second: float, prefill_tokens_per_second: float = 0.0) -> None:
        self._interval = 1.0 / tokens_per_second if tokens_per_second > 0 else 0.0
        self._next_step = 0.0
        self._prefill_rate = prefill_tokens_per_second

    def _pace(self) -> None:
        now = time.monotonic()
        if self._interval and self._next_step > now:
            time.sleep(self._next_step - now)
        self._next_step = max(now, self._next_step) + self._interval

    def _next(self, seq: Sequence) -> Sampled:
        i = len(seq.generated)
        if i >= len(seq.payload):
            return Sampled(self.EOS)
        if not seq.params.logprobs:
            return Sampled(i)
        # certain of its word; the message's next words (round it) are the impossible alternatives
        words, k = len(seq.payload), seq.params.top_logprobs
        others = [((i + d) % words, float("-inf")) for d in range(1, min(k, words))]
        return Sampled(i, 0.0, ((i, 0.0), *others)[:k])

    def prefill(self, seqs: list[Sequence]) -> list[Sampled | None]:
        if self._prefill_rate <= 0:
            self._pace()
            return [self._next(s) for s in seqs]
        steps = [min(PREFILL_CHUNK, len(s.prompt_ids) - s.state.get("prefilled", 0)) for s in seqs]
        time.sleep(max(steps, default=0) / self._prefill_rate)
        out: list[Sampled | None] = []
        for seq, step in zip(seqs, steps, strict=True):
            seq.state["prefilled"] = seq.state.get("prefilled", 0) + step
            done = seq.state["prefilled"] >= len(seq.prompt_ids)
            out.append(self._next(seq) if done else None)
        return out

    def prompt_progress(self, seq: Sequence) -> tuple[int, int, int]:
        """(prompt tokens, of them cached, of them prefilled so far): nothing is cached."""
        return len(seq.prompt_ids), 0, seq.state.get("prefilled", 0)

    def decode(self, seqs: list[Sequence]) -> list[Sampled]:
        self._pace()
        return [self._next(s) for s in seqs]

    def release(self, seqs: list[Sequence]) -> None:
        pass

    def background(self) -> bool:
        return False

    def has_background(self) -> bool:
        return False

    def reset(self) -> None:
        pass

    def is_eos(self, token_id: int) -> bool:
        return token_id == self.EOS


class FakeEngine(Engine):
    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.model_name = settings.model_name or "fake"
        self.context_length = settings.context_length or 4096

    def _load(self) -> None:
        pass

    async def _warm_up(self) -> None:
        pass  # nothing to warm: ready as soon as the scheduler runs

    def _backend(self) -> FakeBackend:
        s = self.settings
        return FakeBackend(s.fake_tokens_per_second, s.fake_prefill_tokens_per_second)

    def _encode(self, messages: list[Message]) -> tuple[list[int], list[str]]:
        prompt_words = sum(len(WORD.findall(m.content)) for m in messages)
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        return list(range(prompt_words)), WORD.findall(last_user)

    def _detokenizer(self, payload: list[str]) -> WordDetokenizer:
        return WordDetokenizer(payload)
