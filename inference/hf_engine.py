"""The real engine: a transformers causal LM behind the continuous-batching scheduler.

The running sequences' KV lives in groups of rows of similar length, each group one
DynamicCache left-padded to its longest row with an attention mask and per-sequence position
ids (inference/batch.py). Prompts are prefilled apart from it, in chunks and on top of the
prefix cache (inference/hf_prefill.py); a prompt's KV then joins the group it pads least, or
starts its own; leaving sequences are removed with an index select, and columns that became
padding for everyone are trimmed. Each decode step is then one forward pass of shape
[batch, 1] (attention group by group), which costs little more than a single sequence on a
bandwidth-bound CPU."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from inference import q4mm
from inference.batch import BatchState, GrowingLayer
from inference.chat_encoder import ChatEncoder
from inference.decode_step import DecodeStep, supports
from inference.engine import Engine, Message
from inference.hf_prefill import Prefiller
from inference.lone_threads import LoneThreads
from inference.model_store import LoadedModel, prepare_model, served_name, stderr_progress
from inference.prefill import PrefillJob
from inference.sampling import sample
from inference.sampling_params import Sampled
from inference.scheduler import Sequence
from inference.settings import Settings
from inference.textstream import IncrementalDetokenizer, TokenBytes

log = logging.getLogger("inference.hf_engine")


class TransformersBackend:
    def __init__(
        self,
        model: Any,
        eos_ids: set[int],
        chunk_tokens: int = 0,
        cache_bytes: int = 0,
        decode_threads: int | None = 0,
        step_seconds: float = 0.0,
        after_reply: list[int] | None = None,
    ) -> None:
        """`decode_threads`: torch threads for a step of one sequence (0: as they are; None:
        whichever of 1 and all its steps run faster, inference/lone_threads.py)."""
        self.model = model
        self.device = model.device
        # on a GPU the step's time is not the CPU threads' to win (and is not known on return)
        self.lone = LoneThreads(
            0 if decode_threads is None and self.device.type != "cpu" else decode_threads,
            torch.get_num_threads(),
        )
        self.eos_ids = eos_ids
        if self.device.type == "cpu":
            q4mm.available()  # one-query attention's kernel: built here, not in the first step
        self.prefiller = Prefiller(model, chunk_tokens, cache_bytes, step_seconds, after_reply)
        # the lean [batch, 1] forward where the model allows it (int4 Llama): same logits,
        # and it attends group by group, so rows of very different lengths need not share one
        # padded KV tensor (inference/batch.py)
        self.fast = DecodeStep(model) if supports(model) else None
        self.batch = BatchState(ragged=self.fast is not None)

    def is_eos(self, token_id: int) -> bool:
        return token_id in self.eos_ids

    def prefill(self, seqs: list[Sequence]) -> list[Sampled | None]:
        done = self.prefiller.step(seqs, decoding=bool(self.batch.rows))
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
        # the prompt's own KV buffers, which have room up to the next key block: a new group
        # takes them as they are, no copy (nothing else writes them any more)
        cache.layers = [
            GrowingLayer(kv[0, :, :n][None], kv[1, :, :n][None], (kv[0][None], kv[1][None]))
            for kv in job.kv
        ]
        mask = torch.ones((1, n), dtype=torch.long, device=self.device)
        self.batch.join([seq], cache, mask, torch.tensor([n], device=self.device))

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> list[Sampled]:
        groups = self.batch.groups
        rows = self.batch.rows  # the groups' order, which a join may differ from `seqs`'
        assert len(rows) == len(seqs) and set(map(id, rows)) == set(map(id, seqs))
        last = torch.tensor(
            [[s.generated[-1] if s.generated else 0] for s in rows], device=self.device
        )
        for g in groups:
            g.mask = torch.cat([g.mask, g.mask.new_ones((len(g.rows), 1))], dim=1)
        pos = torch.cat([g.pos for g in groups])[:, None]
        threads = torch.get_num_threads()
        alone = len(rows) == 1
        count = self.lone.pick() if alone else threads
        if count != threads:
            torch.set_num_threads(count)  # see Settings.decode_threads
        # its LM head, one large call, never on fewer threads than the rest of the process
        head = threads if count < threads else 0
        started = time.perf_counter()
        try:
            logits = self._forward(last, pos, head)
        finally:
            if count != threads:
                torch.set_num_threads(threads)
        if alone:
            self.lone.record(count, time.perf_counter() - started)
        for g in groups:
            g.pos = g.pos + 1
        tokens = dict(zip(map(id, rows), sample(logits[:, -1], rows), strict=True))
        return [tokens[id(s)] for s in seqs]

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, head_threads: int = 0) -> torch.Tensor:
        groups = self.batch.groups
        if self.fast is not None and self.fast.handles(ids.shape[0]):
            masks = [(g.mask, g.cache) for g in groups]
            return self.fast.step(ids, pos, masks, head_threads=head_threads)
        (group,) = groups  # not ragged: one padded batch
        return self.model(
            input_ids=ids,
            attention_mask=group.mask,
            position_ids=pos,
            past_key_values=group.cache,
            use_cache=True,
        ).logits

    def prompt_progress(self, seq: Sequence) -> tuple[int, int, int] | None:
        return self.prefiller.progress(seq)

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
        self.encoder: ChatEncoder | None = None
        self._preloaded = loaded

    def _load(self) -> None:
        loaded = self._preloaded or prepare_model(self.settings, stderr_progress)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.token_bytes = TokenBytes(self.tokenizer)
        self.encoder = ChatEncoder(self.tokenizer)
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
            None if s.decode_threads == "auto" else s.decode_threads,
            s.prefill_step_ms / 1000,
            self.encoder.after_reply() if self.encoder else None,
        )

    def cache_stats(self) -> Any:
        backend = self.scheduler.backend if self.scheduler else None
        return backend.prefiller.stats if isinstance(backend, TransformersBackend) else None

    def _encode(self, messages: list[Message]) -> tuple[list[int], None]:
        return self.encoder.encode(messages), None

    def _detokenizer(self, payload: None) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, self.token_bytes)
