"""Incremental detokenization and stop strings, unit level."""

from __future__ import annotations

from typing import Any

import pytest

from inference.textstream import REPLACEMENT, IncrementalDetokenizer, StopFilter


def _feed(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    f = StopFilter(stops)
    out = [f.feed(p) for p in pieces]
    if not f.stopped:
        out.append(f.flush())
    return out, f.stopped


def test_stop_spanning_tokens_is_never_emitted() -> None:
    out, stopped = _feed(["END"], ["Hello E", "N", "D more"])
    assert stopped and "".join(out) == "Hello "
    assert out[0] == "Hello "  # "E" held back: it could start "END"


def test_false_stop_prefix_is_released() -> None:
    out, stopped = _feed(["END"], ["Hello E", "N", "VY"])
    assert not stopped and "".join(out) == "Hello ENVY"


def test_held_prefix_released_at_the_end() -> None:
    out, stopped = _feed(["\n\n"], ["a\n"])
    assert not stopped and "".join(out) == "a\n" and out[0] == "a"


def test_earliest_of_several_stops_wins() -> None:
    out, stopped = _feed(["c", "b"], ["abc"])
    assert stopped and "".join(out) == "a"


def test_no_stops_passes_through() -> None:
    assert _feed([], ["a", "b"]) == (["a", "b", ""], False)


class _ByteTokenizer:
    """A byte-level tokenizer: one token per UTF-8 byte (the worst case for splitting)."""

    def decode(self, ids: list[int], **_: Any) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_bytes_of_an_emoji_are_held_until_complete() -> None:
    text = "ok 🎉 café"
    det = IncrementalDetokenizer(_ByteTokenizer())
    deltas = [det.push(b) for b in text.encode()] + [det.flush()]
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == text
    assert "" in deltas  # some bytes were held back


@pytest.mark.model
def test_real_tokenizer_emoji_and_accents(loaded_model: Any) -> None:
    tok = loaded_model.tokenizer
    text = "Party 🎉🎉 at the café — 日本語 ok 👩‍👩‍👧!"
    ids = tok.encode(text, add_special_tokens=False)
    det = IncrementalDetokenizer(tok)
    deltas = [det.push(i) for i in ids] + [det.flush()]
    assert all(REPLACEMENT not in d for d in deltas)
    whole = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert "".join(deltas) == whole == text
    assert len(ids) > len([d for d in deltas if d])  # the emoji really spanned tokens
