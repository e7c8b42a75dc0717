"""The batch's KV cache, without the model: tokens written in place, room that grows."""

from __future__ import annotations

import torch

from inference.hf_engine import GrowingLayer


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
