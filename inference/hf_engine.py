"""The real engine: a transformers causal LM behind the continuous-batching scheduler.

The batch keeps ONE DynamicCache for all running sequences, left-padded to a common length
with an attention mask and per-sequence position ids. Prompts are prefilled apart from it, in
chunks and on top of the prefix cache (inference/hf_prefill.py); a prompt's KV is then
concatenated into the batch (the shorter side padded on the left); leaving sequences are
removed with an index select, and columns that became padding for everyone are trimmed. Each
decode step is then one forward pass of shape [batch, 1], which costs little more than a
single sequence on a bandwidth-bound CPU.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from inference.decode_step import DecodeStep, supports
from inference.engine import Engine, Message
from inference.hf_prefill import Prefiller
from inference.model_store import LoadedModel, prepare_model, served_name, stderr_progress
from inference.prefill import PrefillJob
from inference.sampling import sample
from inference.sampling_params import Sampled
from inference.scheduler import Sequence
from inference.settings import Settings
from inference.textstream import IncrementalDetokenizer, TokenBytes

log = logging.getLogger("inference.hf_engine")


def _pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    return torch.cat([mask.new_zeros((mask.shape[0], length - mask.shape[1])), mask], dim=1)


class GrowingLayer(DynamicLayer):
    """One layer's KV for the batch, as views of buffers with room to grow: a decode step writes
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
        batch moves hundreds of MB: no intermediate copy)."""
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


class BatchState:
    """Rows of the running batch: the shared cache, its mask and each row's next position."""

    def __init__(self) -> None:
        self.rows: list[Sequence] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [B, T] 1 = real token
        self.pos: torch.Tensor | None = None  # [B] position of the next token

    def join(self, seqs: list[Sequence], cache: Any, mask: torch.Tensor, pos: torch.Tensor) -> None:
        if not self.rows:
            self.rows, self.cache, self.mask, self.pos = list(seqs), cache, mask, pos
            self.cache.layers = [
                layer if isinstance(layer, GrowingLayer) else GrowingLayer(layer.keys, layer.values)
                for layer in cache.layers
            ]
            return
        assert self.mask is not None and self.pos is not None
        length = max(self.mask.shape[1], mask.shape[1])
        self.cache.layers = [
            GrowingLayer.stacked([(old.keys, old.values), (new.keys, new.values)], length)
            for old, new in zip(self.cache.layers, cache.layers, strict=True)
        ]
        self.mask = torch.cat([_pad_mask(self.mask, length), _pad_mask(mask, length)])
        self.pos = torch.cat([self.pos, pos])
        self.rows.extend(seqs)

    def leave(self, seqs: list[Sequence]) -> None:
        gone = set(map(id, seqs))
        keep = [i for i, s in enumerate(self.rows) if id(s) not in gone]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.reset()
            return
        assert self.mask is not None and self.pos is not None
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

    def reset(self) -> None:
        self.rows, self.cache, self.mask, self.pos = [], None, None, None


class TransformersBackend:
    def __init__(
        self,
        model: Any,
        eos_ids: set[int],
        chunk_tokens: int = 0,
        cache_bytes: int = 0,
        decode_threads: int = 0,
    ) -> None:
        """`decode_threads`: torch threads for a step of one sequence (0: as they are)."""
        self.model = model
        self.decode_threads = decode_threads
        self.device = model.device
        self.eos_ids = eos_ids
        self.batch = BatchState()
        self.prefiller = Prefiller(model, chunk_tokens, cache_bytes)
        # the lean [batch, 1] forward where the model allows it (int4 Llama): same logits
        self.fast = DecodeStep(model) if supports(model) else None

    def is_eos(self, token_id: int) -> bool:
        return token_id in self.eos_ids

    def prefill(self, seqs: list[Sequence]) -> list[Sampled | None]:
        done = self.prefiller.step(seqs)
        ready = [s for s in seqs if id(s) in done]
        if not ready:
            return [None] * len(seqs)
        tokens = sample(torch.stack([done[id(s)][1] for s in ready]), ready)
        for s in ready:
            self._join(s, done[id(s)][0])
        first = dict(zip(map(id, ready), tokens, strict=True))
        return [first.get(id(s)) for s in seqs]

    @torch.inference_mode()
    def _join(self, seq: Sequence, job: PrefillJob) -> None:
        from transformers import DynamicCache

        n = len(job.tokens)
        cache = DynamicCache(config=self.model.config)
        # the prompt's own KV buffers, which have room up to the next key block: an empty batch
        # takes them as they are, no copy (nothing else writes them any more)
        cache.layers = [
            GrowingLayer(kv[0, :, :n][None], kv[1, :, :n][None], (kv[0][None], kv[1][None]))
            for kv in job.kv
        ]
        mask = torch.ones((1, n), dtype=torch.long, device=self.device)
        self.batch.join([seq], cache, mask, torch.tensor([n], device=self.device))

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> list[Sampled]:
        b = self.batch
        assert b.rows == seqs and b.mask is not None and b.pos is not None
        last = torch.tensor(
            [[s.generated[-1] if s.generated else 0] for s in seqs], device=self.device
        )
        b.mask = torch.cat([b.mask, b.mask.new_ones((len(seqs), 1))], dim=1)
        threads = torch.get_num_threads()
        if len(seqs) == 1 and self.decode_threads:
            torch.set_num_threads(self.decode_threads)  # see Settings.decode_threads
        try:
            logits = self._forward(last, b.mask, b.pos[:, None], b.cache)
        finally:
            torch.set_num_threads(threads)
        b.pos = b.pos + 1
        return sample(logits[:, -1], seqs)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        if self.fast is not None and self.fast.handles(ids.shape[0]):
            return self.fast.step(ids, mask, pos, cache)
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        ).logits

    def release(self, seqs: list[Sequence]) -> None:
        self.batch.leave(seqs)
        for s in seqs:
            self.prefiller.finished(s)

    def background(self) -> bool:
        return self.prefiller.background()

    def has_background(self) -> bool:
        return self.prefiller.has_background()

    def reset(self) -> None:
        self.batch.reset()
        self.prefiller.reset()


def encode_chat(tokenizer: Any, messages: list[Message]) -> list[int]:
    """The prompt tokens of a chat, through the model's chat template."""
    chat = [{"role": m.role, "content": m.content} for m in messages]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token that ends a reply: the model's and tokenizer's EOS, and ChatML's end of turn."""
    ids: set[int] = set()
    for src in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        ids.update(src if isinstance(src, list) else [src] if src is not None else [])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return ids


class TransformersEngine(Engine):
    def __init__(self, settings: Settings, loaded: LoadedModel | None = None) -> None:
        """`loaded`: an already prepared model to share (tests, benchmarks); else MODEL is loaded."""
        super().__init__(settings)
        self.model_name = served_name(settings)
        self.context_length = settings.context_length or 2048
        self.model: Any = None
        self.tokenizer: Any = None
        self.token_bytes: TokenBytes | None = None  # shared by every request's detokenizer
        self._preloaded = loaded

    def _load(self) -> None:
        loaded = self._preloaded or prepare_model(self.settings, stderr_progress)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.token_bytes = TokenBytes(self.tokenizer)
        self.vocab_size = int(self.model.config.vocab_size)
        native = int(getattr(self.model.config, "max_position_embeddings", 0) or 2048)
        self.context_length = min(self.settings.context_length or native, native)

    def _backend(self) -> TransformersBackend:
        s = self.settings
        return TransformersBackend(
            self.model,
            eos_ids(self.model, self.tokenizer),
            s.prefill_chunk_tokens,
            s.prefix_cache_mb * 2**20,
            s.decode_threads,
        )

    def cache_stats(self) -> Any:
        backend = self.scheduler.backend if self.scheduler else None
        return backend.prefiller.stats if isinstance(backend, TransformersBackend) else None

    def _encode(self, messages: list[Message]) -> tuple[list[int], None]:
        return encode_chat(self.tokenizer, messages), None

    def _detokenizer(self, payload: None) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, self.token_bytes)
