"""The running batch's KV: groups of rows, each group one left-padded tensor per layer.

A decode step multiplies every row of the batch together (one pass over the weights), but
attention only needs each row's own keys. One padded tensor for the whole batch made every row
read as many positions as the longest: a 4,000-token conversation beside four short chats made
their steps read 4,000 masked positions each, and its arrival copied all five rows into a new
4,000-position buffer (~130 ms on a 2-core CPU, a stall for every stream). So rows are kept in
groups of similar length: a row joins the group its length pads least, and starts a group of
its own (taking its prompt's KV buffers as they are, no copy) when joining would add more than
SPLIT padded positions. Attention then runs once per group per layer.

Only a decode step that knows groups can use more than one (inference/decode_step.py); for
any other model the batch stays one group, exactly the padded batch it always was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

SPLIT = 512  # padded positions a join may add to a group; beyond it the row gets its own
MAX_GROUPS = 4  # each group costs an attention call per layer per step


def _pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    return torch.cat([mask.new_zeros((mask.shape[0], length - mask.shape[1])), mask], dim=1)


class GrowingLayer(DynamicLayer):
    """One layer's KV for a group, as views of buffers with room to grow: a decode step writes
    its token in place, where DynamicLayer concatenates the whole cache into a new tensor at
    every step (at a few thousand tokens, more bytes than the weights)."""

    ROOM = 256  # spare positions at least, and a quarter more than held: growth stays
    # amortised, where doubling would make a 4,000-token prompt's join fault in twice its bytes

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        room: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """`room`: buffers whose first positions are `keys` and `values`, to grow into."""
        super().__init__()
        self.is_initialized = True
        self.dtype, self.device = keys.dtype, keys.device
        if room is None:
            self._set(keys, values)
        else:
            self._k, self._v = room
            self.keys, self.values = keys, values

    @classmethod
    def stacked(cls, parts: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> GrowingLayer:
        """The parts' rows one under the other, each left-padded with zeros to `length`
        positions, written once into a fresh buffer (a join or leave with a long prompt in the
        group moves hundreds of MB: no intermediate copy)."""
        first = parts[0][0]
        b, (h, d) = sum(k.shape[0] for k, _ in parts), (first.shape[1], first.shape[3])
        k_buf = first.new_empty((b, h, length + cls._room(length), d))
        v_buf = torch.empty_like(k_buf)
        row = 0
        for keys, values in parts:
            n, pad = keys.shape[0], length - keys.shape[2]
            for buf, src in ((k_buf, keys), (v_buf, values)):
                buf[row : row + n, :, :pad] = 0  # masked, but must not be NaN
                buf[row : row + n, :, pad:length] = src
            row += n
        return cls(k_buf[:, :, :length], v_buf[:, :, :length], (k_buf, v_buf))

    @classmethod
    def _room(cls, n: int) -> int:
        return max(cls.ROOM, n // 4)

    def _set(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        b, h, n, d = keys.shape
        room = self._room(n)
        self._k, self._v = (
            keys.new_empty((b, h, n + room, d)),
            values.new_empty((b, h, n + room, d)),
        )
        self._k[:, :, :n], self._v[:, :, :n] = keys, values
        self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, add = self.keys.shape[2], key_states.shape[2]
        if n + add > self._k.shape[2]:
            self._set(self.keys, self.values)
        self._k[:, :, n : n + add], self._v[:, :, n : n + add] = key_states, value_states
        self.keys, self.values = self._k[:, :, : n + add], self._v[:, :, : n + add]
        return self.keys, self.values


@dataclass(eq=False)
class Group:
    """Rows sharing one left-padded KV tensor per layer (`cache.layers`), its mask and positions."""

    rows: list[Any]
    cache: Any
    mask: torch.Tensor  # [b, T] 1 = real token
    pos: torch.Tensor  # [b] position of the next token

    def __post_init__(self) -> None:
        self.cache.layers = [
            layer if isinstance(layer, GrowingLayer) else GrowingLayer(layer.keys, layer.values)
            for layer in self.cache.layers
        ]

    def padding_added(self, length: int, rows: int) -> int:
        """Padded positions that `rows` rows of `length` positions would add by joining."""
        width = self.mask.shape[1]
        return max(0, length - width) * len(self.rows) + max(0, width - length) * rows

    def add(self, seqs: list[Any], cache: Any, mask: torch.Tensor, pos: torch.Tensor) -> None:
        length = max(self.mask.shape[1], mask.shape[1])
        self.cache.layers = [
            GrowingLayer.stacked([(old.keys, old.values), (new.keys, new.values)], length)
            for old, new in zip(self.cache.layers, cache.layers, strict=True)
        ]
        self.mask = torch.cat([_pad_mask(self.mask, length), _pad_mask(mask, length)])
        self.pos = torch.cat([self.pos, pos])
        self.rows.extend(seqs)

    def drop(self, gone: set[int]) -> None:
        """Removes the rows whose id() is in `gone` (at least one, not all)."""
        keep = [i for i, s in enumerate(self.rows) if id(s) not in gone]
        idx = torch.tensor(keep, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep]
        self.mask, self.pos = self.mask[idx], self.pos[idx]
        start = int((self.mask.sum(0) > 0).nonzero()[0])  # columns now padding for every row
        self.mask = self.mask[:, start:]
        self.cache.layers = [
            GrowingLayer.stacked(
                [
                    (layer.keys[i : i + 1, :, start:], layer.values[i : i + 1, :, start:])
                    for i in keep
                ],
                self.mask.shape[1],
            )
            for layer in self.cache.layers
        ]


class BatchState:
    """The running batch: its groups, and so its rows (the groups' rows in order)."""

    def __init__(self, ragged: bool = False) -> None:
        """`ragged`: rows may go in several groups (the decode step must take `groups`)."""
        self.ragged = ragged
        self.groups: list[Group] = []

    @property
    def rows(self) -> list[Any]:
        return [s for g in self.groups for s in g.rows]

    def join(self, seqs: list[Any], cache: Any, mask: torch.Tensor, pos: torch.Tensor) -> None:
        added = {g: g.padding_added(mask.shape[1], len(seqs)) for g in self.groups}
        best = min(added, key=added.__getitem__, default=None)
        if best is None or (self.ragged and added[best] > SPLIT and len(added) < MAX_GROUPS):
            self.groups.append(Group(list(seqs), cache, mask, pos))
        else:
            best.add(seqs, cache, mask, pos)

    def leave(self, seqs: list[Any]) -> None:
        gone = set(map(id, seqs))
        kept = []
        for g in self.groups:
            leaving = sum(id(s) in gone for s in g.rows)
            if leaving < len(g.rows):
                if leaving:
                    g.drop(gone)
                kept.append(g)
        self.groups = kept

    def reset(self) -> None:
        self.groups = []
