"""A chat's prompt tokens, reusing those of the conversation's earlier turns.

Every turn of a conversation sends its whole history, and the tokenizer went through all of it
again: 12-16 ms for a 4,066-token conversation on a Zen 4, a tenth of the next turn's time to
its first token once the prefix cache holds the history's KV. The rendered prompt of a next
turn starts with the previous prompt's text, and a fast tokenizer splits its input at added
tokens (ChatML's <|im_start|>, <|im_end|>) before anything else, so the text up to such a token
tokenizes the same alone as inside the whole. The tokens of recent prompts up to their last
added token are kept, and a new prompt that starts with one of those texts tokenizes only
the rest.

That holds only where the added tokens neither strip the whitespace beside them nor match as
single words, and the tokenizer is a fast one; anything else (and a tokenizer that fails the
check on a sample conversation when the encoder is made) tokenizes every prompt whole, as
before. Either way the tokens are the same as those of the chat template's own tokenization.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from inference.engine import Message

KEEP = 32  # recent prompts whose tokens are kept (a conversation's next turn finds its own)
SAMPLE = [  # the check's conversation: every role, a multi-line turn, text around the tokens
    Message("system", "You are a helpful assistant."),
    Message("user", "Hello there!\n  Indented line, then trailing spaces   "),
    Message("assistant", " Hi. How can I help?\n"),
    Message("user", "Explain <b>tags</b> and 3.14159 in one line."),
]


class ChatEncoder:
    def __init__(self, tokenizer: Any, keep: int = KEEP) -> None:
        self.tokenizer = tokenizer
        self.keep = keep
        self._added = _added_tokens(tokenizer)
        self._ids = set(self._added.values())
        self._recent: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()  # prompts are encoded in several worker threads
        self.reuses = bool(self._added) and self._splits_whole(SAMPLE)

    def after_reply(self) -> list[int]:
        """The tokens the chat template puts between an assistant reply's text and the next
        user message's (ChatML: <|im_end|>, "\n", <|im_start|>, "user", "\n"): the prompt of a
        conversation's next turn holds them after the reply whatever the user asks, so they
        can be computed with the reply before it arrives. [] where they cannot be told apart
        (a tokenizer whose prompts are tokenized whole, a template that merges them with the
        text around them)."""
        if not self.reuses:
            return []
        reply, question = "Hello there.", "Zebra crossing?"
        chat = [*SAMPLE[:2], Message("assistant", reply), Message("user", question)]
        text = self._render(chat)
        end = text.find(reply) + len(reply)
        start = text.find(question, end)
        if end < len(reply) or start < 0:
            return []
        before, between = self._tokens(text[:end]), self._tokens(text[end:start])
        # what the template's own tokenization gives: the reply, then exactly those tokens
        whole = encode_chat(self.tokenizer, chat)
        if not between or whole[: len(before) + len(between)] != before + between:
            return []
        return between

    def encode(self, messages: list[Message]) -> list[int]:
        """The prompt tokens of a chat, through the model's chat template."""
        if not self.reuses:
            return encode_chat(self.tokenizer, messages)
        return self._reusing(self._render(messages))

    def _reusing(self, text: str) -> list[int]:
        with self._lock:
            known = max((k for k in self._recent if text.startswith(k)), key=len, default="")
            if known:
                self._recent.move_to_end(known)
            head = self._recent.get(known, [])
        ids = head + self._tokens(text[len(known) :])
        self._remember(text, ids)
        return ids

    def _remember(self, text: str, ids: list[int]) -> None:
        """Keeps the text up to its last added token with the ids up to that token."""
        found = [(at + len(t), t) for t in self._added if (at := text.rfind(t)) >= 0]
        last = next((i for i in range(len(ids) - 1, -1, -1) if ids[i] in self._ids), -1)
        if not found or last < 0:
            return
        cut, token = max(found)
        if ids[last] != self._added[token]:  # not the same token: keep nothing
            return
        with self._lock:
            self._recent[text[:cut]] = ids[: last + 1]
            self._recent.move_to_end(text[:cut])
            while len(self._recent) > self.keep:
                self._recent.popitem(last=False)

    def _splits_whole(self, sample: list[Message]) -> bool:
        """Whether the sample conversation's prompt, and each shorter one of it, tokenize the
        same reusing the one before as through the chat template's own tokenization."""
        try:
            return all(
                self._reusing(self._render(sample[:end]))
                == encode_chat(self.tokenizer, sample[:end])
                for end in range(1, len(sample) + 1)
            )
        finally:
            with self._lock:
                self._recent.clear()

    def _render(self, messages: list[Message]) -> str:
        return self.tokenizer.apply_chat_template(
            _chat(messages), add_generation_prompt=True, tokenize=False
        )

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _added_tokens(tokenizer: Any) -> dict[str, int]:
    """The added tokens' texts and ids, where splitting at them cannot change the tokens
    around them (a fast tokenizer; none strips whitespace or matches as a single word);
    else none (every prompt is tokenized whole)."""
    if not getattr(tokenizer, "is_fast", False):
        return {}
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    if any(t.lstrip or t.rstrip or t.single_word for t in added.values()):
        return {}
    return {t.content: i for i, t in added.items() if t.content}


def encode_chat(tokenizer: Any, messages: list[Message]) -> list[int]:
    """The prompt tokens of a chat, through the model's chat template."""
    ids = tokenizer.apply_chat_template(_chat(messages), add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _chat(messages: list[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]
