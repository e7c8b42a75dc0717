"""bench.tile_order: every order multiplies the same tiles by the same weights."""

from __future__ import annotations

from collections import Counter

import torch

from bench.tile_order import orders


def test_every_order_makes_the_same_multiplications() -> None:
    weights = [[torch.zeros(1), torch.zeros(2)] for _ in range(3)]
    made = {chunk: Counter(map(id, orders(weights, 8, chunk))) for chunk in (1, 2, 4, 8)}
    assert all(counts == made[8] for counts in made.values())
    assert sum(made[1].values()) == 8 * 6


def test_a_pass_takes_each_weight_by_all_its_tiles_in_a_row() -> None:
    weights = [[torch.zeros(1)], [torch.zeros(2)]]
    first, second = weights[0][0], weights[1][0]
    assert list(map(id, orders(weights, 2, 2))) == list(map(id, [first, first, second, second]))
    assert list(map(id, orders(weights, 2, 1))) == list(map(id, [first, second, first, second]))
