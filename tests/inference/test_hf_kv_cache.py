"""The batch's KV cache, without the model: tokens written in place, room that grows."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from inference.hf_engine import BatchState, GrowingLayer


def test_a_growing_layer_keeps_every_token_across_growth() -> None:
    keys = torch.arange(2 * 3 * 5 * 4, dtype=torch.float32).reshape(2, 3, 5, 4)
    layer = GrowingLayer(keys, -keys)
    expected = [keys]
    for step in range(GrowingLayer.ROOM + 7):  # past the first buffer's end
        new = torch.full((2, 3, 1, 4), float(step))
        k, v = layer.update(new, -new)
        expected.append(new)
        assert k.shape[2] == 5 + step + 1 and layer.get_seq_length() == k.shape[2]
    assert torch.equal(layer.keys, torch.cat(expected, dim=2))
    assert torch.equal(layer.values, -torch.cat(expected, dim=2))


def test_a_step_writes_in_place() -> None:
    layer = GrowingLayer(torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8))
    before = layer.keys.data_ptr()
    layer.update(torch.ones(1, 3, 1, 8), torch.ones(1, 3, 1, 8))
    assert layer.keys.data_ptr() == before and layer.keys.shape[2] == 5


def test_a_layer_grows_into_the_room_it_is_given() -> None:
    buf, vbuf = torch.zeros(1, 3, 10, 8), torch.zeros(1, 3, 10, 8)
    layer = GrowingLayer(buf[:, :, :6], vbuf[:, :, :6], (buf, vbuf))
    layer.update(torch.ones(1, 3, 2, 8), torch.ones(1, 3, 2, 8))
    assert layer.keys.data_ptr() == buf.data_ptr() and torch.equal(
        buf[:, :, 6:8], torch.ones(1, 3, 2, 8)
    )
    layer.update(torch.ones(1, 3, 3, 8), torch.ones(1, 3, 3, 8))  # beyond it: a new buffer
    assert layer.keys.shape[2] == 11 and layer.keys.data_ptr() != buf.data_ptr()


class _Cache:
    def __init__(self, layers: list[GrowingLayer]) -> None:
        self.layers = layers


def _two_batches() -> tuple[BatchState, torch.Tensor, torch.Tensor]:
    """Two running rows of 3 positions, then a prompt of 5 joins them."""
    short = torch.arange(2 * 2 * 3 * 4, dtype=torch.float32).reshape(2, 2, 3, 4) + 1
    long = torch.arange(1 * 2 * 5 * 4, dtype=torch.float32).reshape(1, 2, 5, 4) + 100
    state = BatchState()
    state.join(
        ["a", "b"], _Cache([GrowingLayer(short, -short)]), torch.ones(2, 3), torch.tensor([3, 3])
    )
    state.join(["c"], _Cache([GrowingLayer(long, -long)]), torch.ones(1, 5), torch.tensor([5]))
    return state, short, long


def test_a_join_left_pads_the_shorter_rows_with_zeros() -> None:
    state, short, long = _two_batches()
    layer = state.cache.layers[0]
    expected = torch.cat([F.pad(short, (0, 0, 2, 0)), long])
    assert torch.equal(layer.keys, expected) and torch.equal(layer.values, -expected)
    assert state.mask.tolist() == [[0, 0, 1, 1, 1]] * 2 + [[1] * 5]
    assert state.pos.tolist() == [3, 3, 5] and state.rows == ["a", "b", "c"]
    before = layer.keys.data_ptr()
    layer.update(torch.ones(3, 2, 1, 4), torch.ones(3, 2, 1, 4))  # the joined batch has room
    assert layer.keys.data_ptr() == before and torch.equal(layer.keys[:, :, :5], expected)


def test_a_leave_keeps_the_other_rows_and_drops_columns_padded_for_all() -> None:
    state, short, _ = _two_batches()
    state.leave(["c"])
    layer = state.cache.layers[0]
    assert torch.equal(layer.keys, short) and torch.equal(layer.values, -short)
    assert state.mask.tolist() == [[1, 1, 1]] * 2 and state.rows == ["a", "b"]
    state.leave(["a"])
    assert torch.equal(state.cache.layers[0].keys, short[1:]) and state.pos.tolist() == [3]
