"""Turning generated tokens into text deltas that are safe to send.

Two hold-backs make the concatenation of deltas equal the final text:
- an incomplete UTF-8 character (an emoji split over byte tokens) is held until complete, so
  no U+FFFD ever reaches a client;
- text that could be the start of a stop string is held until it is known not to be one,
  so a stop string spanning several tokens is never partly emitted.
"""

from __future__ import annotations

from typing import Any, Protocol

REPLACEMENT = "\ufffd"


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes, alone (what logprobs report for it)."""


class IncrementalDetokenizer:
    """vLLM-style windowed decoding: O(1) per token, exact for byte-level BPE.

    Decoding a short window (a few previous tokens + the new ones) gives tokenizers the
    context they need for spaces; decoding everything each step would be O(n^2).
    """

    def __init__(self, tokenizer: Any, token_bytes: TokenBytes | None = None) -> None:
        """token_bytes: the engine's shared (cached) one; else one of this detokenizer's own."""
        self._tok = tokenizer
        self.token_bytes = token_bytes or TokenBytes(tokenizer)
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # tokens before this index are already emitted

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""  # incomplete character (or nothing visible yet): wait for more bytes
        self._prefix, self._read = self._read, len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever is still held at the end (a truly broken byte sequence stays as-is)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet (Radford et al. 2019): the character standing for each byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


class TokenBytes:
    """Each token's own bytes, cached: exact for byte-level BPE (half a UTF-8 character stays
    half), else the token decoded alone."""

    _ALPHABET = _byte_alphabet()

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._byte_level = "ByteLevel" in repr(getattr(backend, "decoder", None))
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._lookup(token_id)
        return found

    def _lookup(self, token_id: int) -> bytes:
        piece = self._tok.convert_ids_to_tokens(token_id)
        if self._byte_level and isinstance(piece, str) and all(c in self._ALPHABET for c in piece):
            return bytes(self._ALPHABET[c] for c in piece)
        return self._tok.decode([token_id], clean_up_tokenization_spaces=False).encode()


class StopFilter:
    """Cuts the text at the first stop string and holds back possible stop-string prefixes."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._pending = ""  # received but not yet emitted
        self.stopped = False

    def feed(self, text: str) -> str:
        """Returns the text that is now safe to emit; sets `stopped` when a stop string hit."""
        if self.stopped:
            return ""
        self._pending += text
        if not self._stops:
            out, self._pending = self._pending, ""
            return out
        hit = self._first_stop()
        if hit is not None:
            self.stopped = True
            out, self._pending = self._pending[:hit], ""
            return out
        keep = self._held_suffix()
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def flush(self) -> str:
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _first_stop(self) -> int | None:
        found = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        return min(found) if found else None

    def _held_suffix(self) -> int:
        """Length of the longest pending suffix that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:k]):
                    best = k
                    break
        return best
