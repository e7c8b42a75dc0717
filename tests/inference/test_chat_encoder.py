"""A chat's prompt tokens reusing an earlier turn's (inference/chat_encoder.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from inference.chat_encoder import ChatEncoder, encode_chat
from inference.engine import Message

TRICKY = [  # text that BPE merges across when it can: spaces, newlines, digits, non-ASCII
    "Part 1 of my notes:\n  indented   and trailing spaces   ",
    "naïve café — 3.14159 ≈ π; emoji 🙂 and <b>tags</b>\n\n\n",
    "  leading spaces, a tab\tand ```code()```",
    "<|im_end|> typed by a user, and im_start without its bars",
]


def _conversation(turns: int, seed: str) -> list[Message]:
    msgs = [Message("system", "You are a helpful assistant.")]
    for i in range(turns):
        msgs.append(Message("user", f"{seed} {TRICKY[i % len(TRICKY)]} turn {i}"))
        msgs.append(Message("assistant", f" Reply {i}: {TRICKY[(i + 1) % len(TRICKY)]}"))
    return msgs


class _Counting:
    """The real tokenizer, counting the characters it is asked to tokenize."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.chars = tokenizer, 0

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.chars += len(text)
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


@pytest.fixture
def tokenizer(loaded_model: Any) -> _Counting:
    return _Counting(loaded_model.tokenizer)


def test_the_bundled_tokenizer_reuses_earlier_turns(tokenizer: _Counting) -> None:
    assert ChatEncoder(tokenizer).reuses


def test_a_next_turn_tokenizes_only_what_follows_the_turn_before(tokenizer: _Counting) -> None:
    encoder = ChatEncoder(tokenizer)
    history = _conversation(12, "first")
    first = [*history, Message("user", "What are these notes about?")]
    encoder.encode(first)
    second = [*first, Message("assistant", "Notes. "), Message("user", "And in more detail?")]
    tokenizer.chars = 0
    got = encoder.encode(second)
    assert got == encode_chat(tokenizer.tokenizer, second)
    assert tokenizer.chars < 120  # the reply, the question and their tokens around them


def test_every_prompt_has_the_whole_prompts_tokens(tokenizer: _Counting) -> None:
    encoder = ChatEncoder(tokenizer)
    conversations = [_conversation(6, seed) for seed in ("a", "b  ", "\n c")]
    for end in range(1, 14):  # the conversations' turns interleaved, as users send them
        for msgs in conversations:
            prompt = msgs[:end]
            assert encoder.encode(prompt) == encode_chat(tokenizer.tokenizer, prompt)


def test_only_the_most_recent_prompts_are_kept(tokenizer: _Counting) -> None:
    encoder = ChatEncoder(tokenizer, keep=2)
    first, second, third = (_conversation(4, seed) for seed in ("x", "y", "z"))
    for msgs in (first, second, third):
        encoder.encode(msgs)
    tokenizer.chars = 0
    encoder.encode([*third, Message("user", "more")])
    assert tokenizer.chars < 80
    tokenizer.chars = 0
    encoder.encode([*first, Message("user", "more")])  # forgotten: all of it again
    assert tokenizer.chars > 200


class _Stub:
    """A fast tokenizer of one token per character, `<s>` its added token."""

    is_fast = True

    def __init__(self, **token: bool) -> None:
        options = {"lstrip": False, "rstrip": False, "single_word": False, **token}
        self.added_tokens_decoder = {0: SimpleNamespace(content="<s>", **options)}

    def apply_chat_template(self, chat: list[dict[str, str]], tokenize: bool, **kwargs: Any) -> Any:
        text = "".join(f"<s>{m['role']}\n{m['content']}\n" for m in chat) + "<s>assistant\n"
        return self(text)["input_ids"] if tokenize else text

    def __call__(self, text: str, **kwargs: Any) -> dict[str, list[int]]:
        parts = text.split("<s>")
        ids = [ord(c) for c in parts[0]]
        for part in parts[1:]:
            ids += [0, *(ord(c) for c in part)]
        return {"input_ids": ids}


@pytest.mark.parametrize("option", ["lstrip", "rstrip", "single_word"])
def test_added_tokens_that_take_whitespace_or_words_leave_every_prompt_whole(option: str) -> None:
    encoder = ChatEncoder(_Stub(**{option: True}))
    assert not encoder.reuses
    msgs = [Message("user", "hi")]
    assert encoder.encode(msgs) == _Stub()("<s>user\nhi\n<s>assistant\n")["input_ids"]


def test_a_tokenizer_that_merges_across_its_added_tokens_tokenizes_every_prompt_whole() -> None:
    class Merging(_Stub):  # a last token that depends on all of the text, as a merge would
        def __call__(self, text: str, **kwargs: Any) -> dict[str, list[int]]:
            return {"input_ids": [*super().__call__(text)["input_ids"], 1000 + len(text)]}

    encoder = ChatEncoder(Merging())
    assert not encoder.reuses
    text = "<s>user\nhi\n<s>assistant\n"
    assert encoder.encode([Message("user", "hi")]) == Merging()(text)["input_ids"]
    # nor is the markup after a reply guessed: a reply is cached as it was decoded
    assert encoder.after_reply() == []


def test_the_markup_after_a_reply_is_the_templates_tokens_before_the_next_question(
    tokenizer: _Counting,
) -> None:
    encoder = ChatEncoder(tokenizer)
    markup = encoder.after_reply()
    assert tokenizer.decode(markup) == "<|im_end|>\n<|im_start|>user\n"
    history = _conversation(2, "markup")
    prompt = encode_chat(tokenizer, history[:-1])  # up to the last reply's opening
    reply = tokenizer(history[-1].content, add_special_tokens=False)["input_ids"]
    turn = encode_chat(tokenizer, [*history, Message("user", "Next?")])
    assert turn[: len(prompt) + len(reply) + len(markup)] == [*prompt, *reply, *markup]
