"""The batch's KV cache, without the model: tokens written in place, room that grows, rows
in groups of similar length."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from inference import batch
from inference.batch import BatchState, GrowingLayer


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
    (group,) = state.groups
    layer = group.cache.layers[0]
    expected = torch.cat([F.pad(short, (0, 0, 2, 0)), long])
    assert torch.equal(layer.keys, expected) and torch.equal(layer.values, -expected)
    assert group.mask.tolist() == [[0, 0, 1, 1, 1]] * 2 + [[1] * 5]
    assert group.pos.tolist() == [3, 3, 5] and state.rows == ["a", "b", "c"]
    before = layer.keys.data_ptr()
    layer.update(torch.ones(3, 2, 1, 4), torch.ones(3, 2, 1, 4))  # the joined batch has room
    assert layer.keys.data_ptr() == before and torch.equal(layer.keys[:, :, :5], expected)


def test_a_leave_keeps_the_other_rows_and_drops_columns_padded_for_all() -> None:
    state, short, _ = _two_batches()
    state.leave(["c"])
    (group,) = state.groups
    layer = group.cache.layers[0]
    assert torch.equal(layer.keys, short) and torch.equal(layer.values, -short)
    assert group.mask.tolist() == [[1, 1, 1]] * 2 and state.rows == ["a", "b"]
    state.leave(["a"])
    assert torch.equal(state.groups[0].cache.layers[0].keys, short[1:])
    assert state.groups[0].pos.tolist() == [3]


def _row(name: str, length: int) -> tuple[list[str], _Cache, torch.Tensor, torch.Tensor]:
    keys = torch.full((1, 2, length, 4), float(length))
    return (
        [name],
        _Cache([GrowingLayer(keys, -keys)]),
        torch.ones(1, length),
        torch.tensor([length]),
    )


def test_a_row_much_longer_than_the_others_gets_a_group_of_its_own_without_a_copy() -> None:
    state = BatchState(ragged=True)
    state.join(*_row("a", 40))
    state.join(*_row("b", 50))
    long = _row("c", 40 + batch.SPLIT + 100)
    state.join(*long)
    assert [g.rows for g in state.groups] == [["a", "b"], ["c"]]
    # the long prompt's KV is not padded or copied, and the short rows read none of it
    assert state.groups[1].cache.layers[0].keys is long[1].layers[0].keys
    assert state.groups[0].mask.shape[1] == 50
    state.join(*_row("d", 30))  # a short one joins the short group
    assert [g.rows for g in state.groups] == [["a", "b", "d"], ["c"]]


def test_without_ragged_decoding_every_row_shares_one_group() -> None:
    state = BatchState()
    state.join(*_row("a", 40))
    state.join(*_row("c", 40 + batch.SPLIT + 100))
    assert [g.rows for g in state.groups] == [["a", "c"]]


def test_groups_are_capped_and_a_group_whose_rows_all_leave_is_gone() -> None:
    state = BatchState(ragged=True)
    lengths = [10 + i * (batch.SPLIT + 10) for i in range(batch.MAX_GROUPS + 1)]
    names = [f"r{i}" for i in range(len(lengths))]  # rows are told apart by identity
    for name, n in zip(names, lengths, strict=True):
        state.join(*_row(name, n))
    assert len(state.groups) == batch.MAX_GROUPS  # the last joined the group it pads least
    assert state.groups[-1].rows == names[-2:]
    state.leave(names[:1])
    assert len(state.groups) == batch.MAX_GROUPS - 1 and names[0] not in state.rows
    state.leave(state.rows)
    assert state.groups == [] and state.rows == []
