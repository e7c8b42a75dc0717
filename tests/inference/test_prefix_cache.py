"""The prefix cache on its own: block-aligned longest prefix, sharing, the byte bound, LRU order."""

from __future__ import annotations

import torch

from inference.prefix_cache import BLOCK, PrefixCache

DIM = 1  # the token dimension of the KV tensors below: [2, tokens, 4]


def kv_of(tokens: list[int]) -> torch.Tensor:
    """A KV stand-in whose values say which token they belong to."""
    t = torch.tensor(tokens, dtype=torch.float32)
    return torch.stack([t, -t])[:, :, None].expand(2, len(tokens), 4).contiguous()


BLOCK_BYTES = kv_of([0] * BLOCK).numel() * 4


def make(blocks: int) -> PrefixCache:
    return PrefixCache(blocks * BLOCK_BYTES, token_dim=DIM)


def hit(cache: PrefixCache, tokens: list[int], limit: int) -> tuple[int, torch.Tensor]:
    """The cached prefix's length and its KV, all blocks together."""
    blocks = cache.lookup(tokens, limit)
    return len(blocks) * BLOCK, torch.cat(blocks, dim=DIM) if blocks else torch.empty(0)


def test_miss_then_longest_block_aligned_prefix() -> None:
    cache = make(100)
    prompt = list(range(100, 150))  # 50 tokens: 3 whole blocks
    assert cache.lookup(prompt, len(prompt)) == []
    cache.insert(prompt, kv_of(prompt), len(prompt))
    longer = prompt + [7, 8, 9]
    n, kv = hit(cache, longer, len(longer) - 1)
    assert n == 3 * BLOCK
    assert torch.equal(kv, kv_of(prompt[:n]))


def test_limit_keeps_the_last_token_to_compute() -> None:
    cache = make(100)
    prompt = list(range(2 * BLOCK))
    cache.insert(prompt, kv_of(prompt), len(prompt))
    assert hit(cache, prompt, len(prompt) - 1)[0] == BLOCK
    assert hit(cache, prompt, len(prompt))[0] == 2 * BLOCK


def test_divergent_prompts_share_their_common_blocks() -> None:
    cache = make(100)
    system = list(range(2 * BLOCK))
    a, b = system + [1] * BLOCK, system + [2] * BLOCK
    cache.insert(a, kv_of(a), len(a))
    cache.insert(b, kv_of(b), len(b))
    assert cache.stats.inserted_blocks == 4  # the system prompt's 2 blocks once
    other = system + [3] * (BLOCK + 1)
    assert hit(cache, other, len(other))[0] == 2 * BLOCK
    n, kv = hit(cache, b + [0], len(b))
    assert n == 3 * BLOCK and torch.equal(kv, kv_of(b))


def test_a_changed_token_stops_the_match_at_its_block() -> None:
    cache = make(100)
    prompt = list(range(4 * BLOCK))
    cache.insert(prompt, kv_of(prompt), len(prompt))
    edited = list(prompt)
    edited[2 * BLOCK + 3] = -1
    assert hit(cache, edited, len(edited))[0] == 2 * BLOCK


def test_hit_rate_counts_request_lookups_only() -> None:
    cache = make(100)
    prompt = list(range(2 * BLOCK + 4))
    cache.insert(prompt, kv_of(prompt), len(prompt))
    hit(cache, prompt, len(prompt) - 1)
    cache.lookup(prompt, len(prompt), count=False)
    assert cache.stats.query_tokens == len(prompt)
    assert cache.stats.hit_tokens == 2 * BLOCK
    assert cache.stats.hit_rate == 2 * BLOCK / len(prompt)


def test_bytes_stay_within_the_bound_and_the_oldest_go_first() -> None:
    cache = make(6)
    convs = [[c * 1000 + i for i in range(3 * BLOCK)] for c in range(4)]
    for conv in convs:
        cache.insert(conv, kv_of(conv), len(conv))
        assert cache.stats.bytes <= cache.capacity_bytes
    assert cache.stats.blocks == 6 and cache.stats.evicted_blocks == 6
    assert [hit(cache, c, len(c))[0] for c in convs] == [0, 0, 3 * BLOCK, 3 * BLOCK]


def test_a_used_prefix_outlives_a_newer_unused_one() -> None:
    cache = make(6)
    old, new, newest = ([c * 1000 + i for i in range(2 * BLOCK)] for c in range(3))
    cache.insert(old, kv_of(old), len(old))
    cache.insert(new, kv_of(new), len(new))
    hit(cache, old, len(old))  # used again: now the most recent
    cache.insert(newest, kv_of(newest), len(newest))
    cache.insert(newest + [5] * 2 * BLOCK, kv_of(newest + [5] * 2 * BLOCK), 4 * BLOCK)
    assert hit(cache, old, len(old))[0] == 2 * BLOCK
    assert hit(cache, new, len(new))[0] == 0


def test_eviction_takes_a_chain_from_its_tail() -> None:
    """A chain is never cut in the middle: what is left of it is still a usable prefix."""
    cache = make(5)
    conv = list(range(4 * BLOCK))
    cache.insert(conv, kv_of(conv), len(conv))
    other = [9000 + i for i in range(2 * BLOCK)]
    cache.insert(other, kv_of(other), len(other))
    n, kv = hit(cache, conv, len(conv))
    assert n == 3 * BLOCK and torch.equal(kv, kv_of(conv[:n]))
    assert cache.stats.blocks == 5


def test_cached_kv_is_a_copy() -> None:
    cache = make(10)
    prompt = list(range(BLOCK))
    kv = kv_of(prompt)
    cache.insert(prompt, kv, len(prompt))
    kv.zero_()  # the caller reuses its tensor
    assert torch.equal(hit(cache, prompt, len(prompt))[1], kv_of(prompt))
