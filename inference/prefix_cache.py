"""Prefix cache: the KV cache of recent prompts and replies, reused by later requests.

Tokens are cached in blocks of BLOCK tokens. A block is found by its parent block and its own
tokens (vLLM's automatic prefix caching chains hashes the same way), so a lookup walks the
new prompt block by block and stops at the first block nobody computed: the longest cached
block-aligned prefix, shared across requests and users (a preset system prompt, every earlier
turn of a conversation). Keys are exact (the parent's id and the token tuple), never a bare
hash, so two different prefixes can never be confused.

The store is bounded in bytes. Least recently used blocks go first, and a lookup or insert
touches a chain from its last block back to its first, so the LRU order always evicts a
chain's tail before its head: no cached block is ever unreachable.

The cache does not know the model: a block's KV is one tensor whose `token_dim` indexes its
tokens, cloned on insert (the caller's tensor is written again later) and handed out on a hit.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

BLOCK = 16
_ROOT = 0


@dataclass(eq=False)
class _Block:
    id: int
    parent: int
    tokens: tuple[int, ...]
    kv: torch.Tensor


@dataclass
class CacheStats:
    """Counters since start; `hit_tokens / query_tokens` is the hit rate."""

    query_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # of those, served from the cache
    inserted_blocks: int = 0
    evicted_blocks: int = 0
    bytes: int = 0
    blocks: int = 0
    capacity_bytes: int = 0
    # outside the bound: the last cached reply's buffer, kept for its next turn (hf_prefill)
    kept_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


@dataclass
class PrefixCache:
    capacity_bytes: int
    token_dim: int
    block: int = BLOCK
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        self._by_key: dict[tuple[int, tuple[int, ...]], _Block] = {}
        self._lru: OrderedDict[int, _Block] = OrderedDict()  # oldest first
        self._ids = itertools.count(1)
        self.stats.capacity_bytes = self.capacity_bytes

    def _chain(self, tokens: Seq[int], limit: int) -> list[_Block]:
        chain: list[_Block] = []
        parent = _ROOT
        for start in range(0, limit - self.block + 1, self.block):
            blk = self._by_key.get((parent, tuple(tokens[start : start + self.block])))
            if blk is None:
                break
            chain.append(blk)
            parent = blk.id
        return chain

    def _touch(self, chain: list[_Block]) -> None:
        for blk in reversed(chain):  # the head ends up newest: tails are evicted first
            self._lru.move_to_end(blk.id)

    def lookup(self, tokens: Seq[int], limit: int, count: bool = True) -> list[torch.Tensor]:
        """The KV blocks of the longest cached prefix of `tokens[:limit]`, in order (BLOCK
        tokens each along `token_dim`); the caller copies them where it needs them.

        `limit` lets the caller keep the last prompt token to compute (its logits give the
        first reply token); `count`: whether the lookup counts in the hit rate (a request's
        prompt does, the server's own lookups do not)."""
        chain = self._chain(tokens, min(limit, len(tokens)))
        if count:
            self.stats.query_tokens += len(tokens)
            self.stats.hit_tokens += len(chain) * self.block
        self._touch(chain)
        return [blk.kv for blk in chain]

    def insert(self, tokens: Seq[int], kv: torch.Tensor, length: int) -> None:
        """Caches the full blocks of `tokens[:length]`, whose KV is `kv` (indexed by token
        along `token_dim`), keeping what is cached already."""
        chain = self._chain(tokens, length)
        parent = chain[-1].id if chain else _ROOT
        start = len(chain) * self.block
        for s in range(start, length - self.block + 1, self.block):
            toks = tuple(tokens[s : s + self.block])
            blk = _Block(
                next(self._ids), parent, toks, kv.narrow(self.token_dim, s, self.block).clone()
            )
            self._by_key[(parent, toks)] = blk
            self._lru[blk.id] = blk
            self.stats.bytes += _nbytes(blk.kv)
            self.stats.inserted_blocks += 1
            chain.append(blk)
            parent = blk.id
        self._touch(chain)
        self._evict()

    def _evict(self) -> None:
        while self._lru and self.stats.bytes > self.capacity_bytes:
            _, blk = self._lru.popitem(last=False)
            del self._by_key[(blk.parent, blk.tokens)]
            self.stats.bytes -= _nbytes(blk.kv)
            self.stats.evicted_blocks += 1
        self.stats.blocks = len(self._lru)

    def clear(self) -> None:
        self._by_key.clear()
        self._lru.clear()
        self.stats.bytes = self.stats.blocks = 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
