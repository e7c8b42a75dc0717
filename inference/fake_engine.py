"""ENGINE=fake: no model. Streams the words of the last user message back, one token per
word (with its leading space), at FAKE_TOKENS_PER_SECOND, then stops: for tests, demos on
tiny machines and load tests of everything around the model. Never imports torch."""

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


class FakeBackend:
    """Token i of a sequence is word i of its last user message; then end of sequence."""

    EOS = -1

    def __init__(self, tokens_per_second: float) -> None:
        self._interval = 1.0 / tokens_per_second if tokens_per_second > 0 else 0.0
        self._next_step = 0.0

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
        self._pace()
        return [self._next(s) for s in seqs]

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
        return FakeBackend(self.settings.fake_tokens_per_second)

    def _encode(self, messages: list[Message]) -> tuple[list[int], list[str]]:
        prompt_words = sum(len(WORD.findall(m.content)) for m in messages)
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        return list(range(prompt_words)), WORD.findall(last_user)

    def _detokenizer(self, payload: list[str]) -> WordDetokenizer:
        return WordDetokenizer(payload)
