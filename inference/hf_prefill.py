"""The transformers backend's prefill: chunked, on top of the prefix cache, packed.

Each call of `step` computes at most one chunk (PREFILL_CHUNK_TOKENS, shared fairly by the
prompts being prefilled) in one forward pass, so the scheduler can run a decode step of the
running batch between chunks. A prompt starts from the longest prefix of it in the prefix
cache, and its blocks go into the cache once it is computed. When a reply ends, its prompt and
reply (and the chat template's markup that opens the next user turn) are prefilled again in
the background, chunk by chunk once the model has been idle for a moment
(scheduler.BACKGROUND_AFTER), and cached: the next turn of the conversation then finds the
whole history. A next turn that comes sooner holds the reply in its own prompt, which then
computes and caches it, and the background job is dropped. The reply's own KV,
from the decode steps, is not reused, because it came from other kernels (the 4-bit weights,
one query per call): a next turn built on it would answer differently than from scratch.

Every path computes a token's KV with the same bits (inference/prefill_attention.py), so
greedy replies are the same with the cache cold, warm or off, chunked or not.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Any

import torch

from inference import prefill_stages, quant
from inference.prefill import (
    ALIGN,
    MIN_ROWS,
    Piece,
    PrefillJob,
    StepPace,
    chunk_cost,
    layer_flops_ratio,
    plan_chunk,
    tile_cost,
)
from inference.prefill_attention import ATTN_BLOCK, PrefillPlan, register
from inference.prefill_stages import Staged, StagedForward
from inference.prefix_cache import BLOCK, CacheStats, PrefixCache

MAX_SEALS = 16  # finished replies waiting to be cached; older ones are dropped
KV_TOKEN_DIM = 3  # [layers, 2, kv_heads, tokens, head_dim]
# tokens a finished reply's buffer has room for past it: a next turn's question and its chat
# markup fit in place (~12 MB for the bundled model in bfloat16, paged in only where written)
NEXT_TURN_ROOM = 512
# prompts whose first reply token's logits are kept (Prefiller.first): ~100 KB each
MAX_FIRST = 16
# A chunk that will go through in stages (streams are decoding) is planned for up to this
# many steps' budget, cut down to a tile edge: whichever fills its stages best
# (Prefiller._fullest). Every stage costs the running streams a decode step after it.
# Planned for one, a chunk rounded up to its tile edge came out just over the budget and
# went in two stages of half a step each: a 4,000-token paste took 32 steps of a median
# 102 ms where 180 were aimed at (bench/README.md). Planned for two, a tile that costs just
# over one step (a paste's first ~1,000 positions at 150 ms a step) still went in two
# halves: 77 stages of a median 113 ms over HTTP on a Zen 4. Best of one to four: in one
# process, with 4 streams decoding between stages, 67 stages against 73 (medians of 4
# interleaved rounds), the paste 0.94x as long; over HTTP 2-11 fewer stages, the paste's
# time within the VM's spread (bench/README.md).
MAX_STAGES_PER_CHUNK = 4
# the share of the step time stages are planned to fill: planned full, a VM's jitter made
# the clock cut 12-26 of a paste's ~65 stages a layer short, and the layers left took a
# stage of their own (inference/prefill_stages.py)
STAGE_FILL = 0.9
# seconds of narrow-call probing (inference/narrow.py) per idle step: a request that arrives
# meanwhile waits for the slice, not for the whole probe of a key block (up to 250 ms)
PROBE_SLICE = 0.02


class Prefiller:
    def __init__(
        self,
        model: Any,
        chunk_tokens: int,
        cache_bytes: int,
        step_seconds: float = 0.0,
        after_reply: list[int] | None = None,
    ) -> None:
        """`after_reply`: the tokens the chat template puts after a reply and before the next
        user message (ChatEncoder.after_reply); a finished reply is cached with them."""
        register()
        self.model = model
        self.after_reply = list(after_reply or [])
        cfg = model.config
        self.layers = cfg.num_hidden_layers
        self.kv_heads = cfg.num_key_value_heads
        self.heads = cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.device = model.device
        self.dtype = model.get_input_embeddings().weight.dtype
        # int4's prefill multiplies in its dense weights' dtype (float32 where that is faster),
        # and attends in it too: its attention is as much slower in bfloat16 there
        self.compute_dtype = quant.dense_dtype(model)
        self.pace = StepPace(chunk_tokens, step_seconds)
        self.ratio = layer_flops_ratio(model)
        self.cache = PrefixCache(cache_bytes, KV_TOKEN_DIM) if cache_bytes > 0 else None
        self.jobs: dict[int, PrefillJob] = {}  # id(seq) -> its prompt's job
        self.seals: deque[PrefillJob] = deque()
        # the last of them cached, its buffer kept for the next turn (_take_sealed)
        self.sealed: PrefillJob | None = None
        # The last-token logits of recent prompts (by their tokens). A prompt sent again (a
        # regenerated reply, a client's retry) whose KV is all in the kept buffer then needs
        # no pass at all: its last token alone took a pass over the float32 prefill weights,
        # ~70 ms on a 2-core AMD EPYC. Every path gives these logits the same bits, so a
        # kept copy is what computing them again would give.
        self.first: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self.stages = StagedForward(model) if prefill_stages.supports(model) else None
        # key blocks whose narrow calls (inference/narrow.py) are not probed yet: a probe
        # deep in a prompt took up to 240-250 ms (depth 7,936 on a Zen 5), inside the step
        # of the first prompt to reach that depth (a running stream's gap, a next turn's
        # TTFT); probed while the server is idle, a slice at a time (PROBE_SLICE)
        blocks = getattr(cfg, "max_position_embeddings", 0) // ATTN_BLOCK
        self.unprobed = deque(range(1, blocks) if self.device.type == "cpu" else ())
        self.staged: Staged | None = None  # a chunk part-way through the layers
        # prompts admitted and in no chunk yet (by id(seq)): each may be computed ahead of a
        # long prompt's chunk once (_quick); `cut_in`: the last step did so, between stages
        self.arrived: set[int] = set()
        self.cut_in = False
        # a paced stage stops between layers once the next would end past the step time
        # (StagedForward.run): the learnt pace plans it, but a machine that slows between
        # steps (a VM's neighbours) made stages planned for 150 ms run 230-290, and every
        # running stream waited that long
        self.deadlines = True

    @property
    def stats(self) -> CacheStats:
        return self.cache.stats if self.cache else CacheStats()

    def step(
        self, seqs: list[Any], decoding: bool = True
    ) -> dict[int, tuple[PrefillJob, torch.Tensor]]:
        """One step over the prompts of `seqs`: a chunk, or the next layers of a chunk in
        stages; for each prompt it completed (by id(seq)): its job (whose `kv` holds the
        prompt's KV) and its last position's logits. Stages are for the decode steps of
        running streams between them: with none `decoding`, a chunk goes through whole."""
        jobs = [self.jobs.get(id(s)) or self._start(s) for s in seqs]
        if known := {job: job.first for job in jobs if not job.remaining}:
            # a prompt sent again, all of it in place with its logits: no pass to run
            return self._completed(self._planned([(job, 0) for job in known]), known)
        if self.staged is not None and not any(self._live(job) for job, _ in self.staged.work):
            self.staged = None  # every prompt of it was cancelled
        if quick := self._quick(jobs, decoding):
            return self._completed(quick, self._run(self._planned(quick)))
        if self.staged is None:
            budget = self.pace.budget(tile_cost(jobs, self.ratio))
            if self.stages is None:  # not a model it can stage: the chunk in one pass
                work = plan_chunk(jobs, budget, self.ratio)
                return self._completed(work, self._run(work, budget))
            if decoding and self.pace.paced:
                work = self._fullest(jobs, budget)
            else:
                work = plan_chunk(jobs, budget, self.ratio)
            self.staged = self._begin(self._planned(work))
        done = self._stage(self.staged, split=decoding)
        if done is None:
            return {}
        work, self.staged = self.staged.work, None
        return self._completed(work, done)

    def _fullest(self, jobs: list[PrefillJob], budget: float) -> list[tuple[PrefillJob, int]]:
        """The chunk, planned for one to MAX_STAGES_PER_CHUNK steps' `budget` and cut down to
        a tile edge (not up past the stages' budget: a chunk just over it took another
        stage), whose stages come closest to filling the step time; or the smallest of them
        that completes a request's prompt (a question sharing the chunk waits for all its
        stages). A stage of one layer over the step time is only for the smallest chunk."""
        units = self._stage_units()
        best: list[tuple[PrefillJob, int]] = []
        best_fill = -1.0
        for steps in range(1, MAX_STAGES_PER_CHUNK + 1):
            work = plan_chunk(jobs, budget * steps, self.ratio, overshoot=1.0)
            cost = chunk_cost(work, self.ratio)
            if best and cost / len(self.stages.layers) > units:
                break
            if _completes_request(work):
                return work  # a prompt someone waits for goes in the fewest stages
            fill = cost / (self.stages.stage_count(cost, units) * units)
            if fill > best_fill:
                best, best_fill = work, fill
        return best

    def _stage_units(self) -> float:
        """The cost units a stage is planned to fill: what _fullest plans chunks by must be
        what _stage splits them by."""
        return self.pace.units_in_step() * STAGE_FILL

    def _quick(self, jobs: list[PrefillJob], decoding: bool) -> list[tuple[PrefillJob, int]]:
        """While streams decode, a step for the prompts admitted since the last chunk was
        planned that it computes whole, ahead of a long prompt's chunk in stages (at most one
        such step between two stages, each prompt once, so the chunk still goes on), or
        with the rest of the step shared by the other prompts when no chunk is in stages.
        In a chunk planned for several steps, or behind one in stages, a short
        question asked during another user's paste waited for its first token ~0.5 s
        (in-process, median) instead of ~0.26 s; ahead of it, ~0.06 s. [] for no such step."""
        new = [job for job in jobs if id(job.seq) in self.arrived]
        if not (new and decoding and self.pace.paced and self.stages is not None):
            return []
        if self.staged is not None and self.cut_in:
            self.cut_in = False
            return []
        staged = {id(job) for job, _ in self.staged.work} if self.staged else set()
        pool = [job for job in jobs if job.remaining and id(job) not in staged]
        budget = self.pace.budget(tile_cost(pool, self.ratio))
        work = plan_chunk(pool, budget, self.ratio, overshoot=1.0)
        whole = [(job, n) for job, n in work if n == job.remaining and id(job.seq) in self.arrived]
        # within the step's time itself, not the budget's floor of a whole tile: on a CPU
        # too slow for a tile in a step, a tile goes in stages for the running streams
        units = self.pace.units_in_step()
        for step in (work, whole):
            if whole and self._quick_cost(step) <= units:
                self.cut_in = self.staged is not None
                return step
        return []

    def _quick_cost(self, work: list[tuple[PrefillJob, int]]) -> float:
        """chunk_cost of a step, but on the CPU a step of fewer rows than a tile counts half a
        tile at least rather than a whole one: its matmuls multiply only its own rows (narrow
        calls, quant.invariant_linear), and a short question's step took about half a tile's
        time (StepPace.record). Counted as a whole tile, a 60-token question asked during a
        paste on a Zen 4 (a tile 128 units, the step 125) never went ahead of the paste's
        chunk and waited for its stages, up to 0.9 s."""
        cost = chunk_cost(work, self.ratio)
        rows = sum(n for _, n in work)
        if self.device.type != "cpu" or rows >= ALIGN:
            return cost
        return cost - ALIGN + max(rows, ALIGN / 2)

    def _planned(self, work: list[tuple[PrefillJob, int]]) -> list[tuple[PrefillJob, int]]:
        """`work`, its prompts counted as planned (no longer just arrived)."""
        for job, _ in work:
            self.arrived.discard(id(job.seq))
        return work

    def _completed(
        self, work: list[tuple[PrefillJob, int]], done: dict[PrefillJob, torch.Tensor]
    ) -> dict[int, tuple[PrefillJob, torch.Tensor]]:
        """A chunk went through: its prompts that are still wanted and complete, by id(seq)."""
        done = {job: logits for job, logits in done.items() if self._live(job)}
        for job, logits in done.items():
            del self.jobs[id(job.seq)]
            self._remember(job.tokens, logits)
        # every chunk's whole blocks go into the cache as it completes: a 4,000-token
        # prompt's 92 MB copied at its end held the running streams for its last step
        for job, _ in work:
            if job in done or self._live(job):
                self._cache(job)
        return {id(job.seq): (job, logits) for job, logits in done.items()}

    def _remember(self, tokens: list[int], logits: torch.Tensor) -> None:
        key = tuple(tokens)
        if key in self.first:  # a prompt served from them: the same logits, kept already
            self.first.move_to_end(key)
            return
        self.first[key] = logits.clone()  # not a view that holds the chunk's other rows
        while len(self.first) > MAX_FIRST:
            self.first.popitem(last=False)

    def _live(self, job: PrefillJob) -> bool:
        return self.jobs.get(id(job.seq)) is job

    def background(self) -> bool:
        """One piece of idle-time work: a chunk of caching a finished reply, else one key
        block's narrow-call probes; whether more remains."""
        if self.seals:
            job = self.seals[0]
            if job.kv.numel() == 0:  # set up when it first runs: the cache may hold more
                guessed = job.guessed
                job = self.seals[0] = self._job(job.tokens, None, False, NEXT_TURN_ROOM)
                job.guessed = guessed
            if job.remaining:
                budget = self.pace.budget(tile_cost([job], self.ratio))
                self._run(plan_chunk([job], budget, self.ratio), budget)
            if not job.remaining:
                self.seals.popleft()
                self._cache(job)
                self._keep(job)
        elif self.unprobed:
            dtype = self.compute_dtype or self.dtype  # what its queries attend in
            like = torch.empty((self.heads, 0, self.head_dim), dtype=dtype)
            plan = PrefillPlan([], self.kv_heads, self.compute_dtype)
            if plan.prime(like, self.unprobed[0], PROBE_SLICE):
                self.unprobed.popleft()
        return self.has_background()

    def has_background(self) -> bool:
        return bool(self.seals or self.unprobed)

    def progress(self, seq: Any) -> tuple[int, int, int] | None:
        """(prompt tokens, of them from the cache, of them computed) of a prompt being
        prefilled; None before its first step and after its last. A chunk part-way through
        the layers in stages counts for the share of layers done: while streams decode, a
        chunk takes up to MAX_STAGES_PER_CHUNK steps, and its prompt's progress moves with
        each of them rather than once at its end."""
        job = self.jobs.get(id(seq))
        if job is None:
            return None
        done, staged = job.done, self.staged
        if staged is not None:
            done += sum(n for piece, n in staged.work if piece is job) * staged.layer // self.layers
        return len(job.tokens), job.cached, done

    def finished(self, seq: Any) -> None:
        """A reply ended: cache its prompt and reply for the conversation's next turn."""
        job = self.jobs.pop(id(seq), None)
        self.arrived.discard(id(seq))
        if job is not None:  # cancelled while its prompt was prefilled: keep what was computed
            self._cache(job)
            return
        # all of them, not only the whole blocks the cache keeps: the buffer kept for the
        # next turn (_take_sealed) then holds the reply's last partial block too, which that
        # turn would otherwise compute again among its own new tokens
        if self.cache is None or not seq.generated:
            return
        markup = self._next_turn_markup(seq)
        tokens = list(seq.prompt_ids) + list(seq.generated) + markup
        # its KV is set up when it runs
        self.seals.append(PrefillJob(tokens, torch.empty(0), guessed=len(markup)))
        while len(self.seals) > MAX_SEALS:
            self.seals.popleft()

    def _next_turn_markup(self, seq: Any) -> list[int]:
        """What the next turn's prompt will hold after this reply before its question: the
        reply's end-of-turn token where the reply stopped short of it (max_tokens), then the
        user turn's opening. A 4,000-token conversation's next turn then computes 11 new
        tokens instead of 16: its prefill step 17% shorter on a Zen 3 (bench/README.md). A turn
        that does not continue that way shares the buffer up to where it differs, as before."""
        markup = self.after_reply
        if markup and seq.generated[-1] == markup[0]:
            return markup[1:]
        return markup

    def reset(self) -> None:
        self.staged = None
        self.arrived.clear()
        self._keep(None)
        self.first.clear()
        self.jobs.clear()
        self.seals.clear()

    def _start(self, seq: Any) -> PrefillJob:
        tokens = list(seq.prompt_ids)
        # a finished reply this prompt continues (its next turn) is cached with this prompt
        # when it completes: computing it in the background as well would only delay it
        self.seals = deque(s for s in self.seals if not _continues(tokens, s))
        job = self.jobs[id(seq)] = self._job(tokens, seq, count=True)
        self.arrived.add(id(seq))
        return job

    def _job(self, tokens: list[int], seq: Any, count: bool, room: int = 0) -> PrefillJob:
        """A job for `tokens` on top of their longest cached prefix; `room`: tokens that a
        next turn may add in place (the last key block is whole in any case)."""
        # a prompt's last token is computed, for its logits (the first reply token), unless
        # they are kept from an earlier request of the same prompt
        first = self.first.get(tuple(tokens)) if seq is not None else None
        limit = len(tokens) - 1 if seq is not None and first is None else len(tokens)
        blocks = self.cache.lookup(tokens, limit, count) if self.cache is not None else []
        kv, have = self._take_sealed(tokens, limit, request=seq is not None)
        if kv is None:
            kv = self._buffer(_whole_blocks(len(tokens) + room))
        for i in range(have // BLOCK, len(blocks)):
            kv[:, :, :, i * BLOCK : (i + 1) * BLOCK] = blocks[i]
        job = PrefillJob(tokens, kv, seq=seq, first=first)
        # what the buffer brought counts as cached: it is in the cache already (or was, and
        # was evicted since), so only the blocks computed from here on are inserted
        job.done = job.cached = max(have, len(blocks) * BLOCK)
        _clear_tail(kv, job.done)
        return job

    def _take_sealed(
        self, tokens: list[int], limit: int, request: bool
    ) -> tuple[torch.Tensor | None, int]:
        """The buffer of the last reply cached in the background, and how many tokens of it
        hold KV, for a prompt that continues it (the conversation's next turn: its history
        is in place already) or, for a `request`, that it holds up to the request's
        `limit` (its prompt sent again, a regenerated reply: nothing is left to compute where
        the first reply token's logits are kept, else only the last token, where the cache's
        whole blocks left up to 16). Copying that history from the cache into a fresh buffer
        took 30-69 ms of a 4,000-token conversation's next turn (~23,000 page faults of the
        new buffer) on a 2-core AMD EPYC, where the whole turn took ~200-290 ms."""
        sealed = self.sealed
        if sealed is None:
            return None, 0
        fits = sealed.kv.shape[KV_TOKEN_DIM] >= _whole_blocks(len(tokens))
        shared = min(_common(tokens, sealed.tokens), limit)
        again = request and shared == limit > 0  # all of a request's prompt it may take
        if not fits or not (again or _enough(shared, len(sealed.tokens) - sealed.guessed)):
            return None, 0
        self._keep(None)  # one prompt's own from now on: its KV is written past `shared`
        # the KV past the tokens both share came from the old ones: it is computed again
        return sealed.kv, shared

    def _keep(self, job: PrefillJob | None) -> None:
        """The buffer kept for a next turn (_take_sealed), its size in the cache's stats."""
        self.sealed = job
        if self.cache is not None:
            self.cache.stats.kept_bytes = 0 if job is None else job.kv.nbytes

    def _buffer(self, capacity: int) -> torch.Tensor:
        # In plain 4 KiB pages, which fault in as chunks fill them. Advised into huge pages
        # (madvise), a fresh prompt's first write faulted in its whole buffer, 94 MB for
        # 4,000 tokens, inside its first chunk's step: 120-140 ms instead of 2 ms on a 2-core
        # AMD EPYC (Zen 5), and a next turn's copy of its cached prefix took 16-127 ms
        # instead of 23-37 (in 2 MiB pages it had saved ~17 ms on an Intel Xeon).
        return torch.empty(
            (self.layers, 2, self.kv_heads, capacity, self.head_dim),
            dtype=self.dtype,
            device=self.device,
        )

    def _cache(self, job: PrefillJob) -> None:
        if self.cache is not None and job.done > job.cached:
            self.cache.insert(job.tokens, job.kv, job.done)

    def _run(
        self, work: list[tuple[PrefillJob, int]], budget: float | None = None
    ) -> dict[PrefillJob, torch.Tensor]:
        """One forward pass over the pieces packed in one row; logits of completed prompts.
        Its time teaches the pace when it used most of `budget` (the step's)."""
        cost, whole = chunk_cost(work, self.ratio), _whole_prompts(work)
        budget = self.pace.budget() if budget is None else budget
        start = time.perf_counter()
        done = self._finish(self._forward(work))
        self.pace.record(cost, time.perf_counter() - start, budget, whole)
        return done

    def _begin(self, work: list[tuple[PrefillJob, int]]) -> Staged:
        """A chunk embedded, ready for its first stage."""
        inputs, ending, keep = self._inputs(work)
        chunk = {"work": work, "ending": ending, "keep": keep}
        with quant.dense_only():
            return self.stages.begin(inputs, cost=chunk_cost(work, self.ratio), **chunk)

    def _stage(self, staged: Staged, split: bool = True) -> dict[PrefillJob, torch.Tensor] | None:
        """The chunk's next layers, as many as fit the step's time (all of them unless steps
        are paced and `split`); the prompts it completed once it went through them all, else
        None."""
        budget = self._stage_units()
        total = len(self.stages.layers)
        paced = self.pace.paced and split
        layers = self.stages.layers_within(staged, budget) if paced else total - staged.layer
        head_only = staged.layer == total
        # a chunk in several stages takes its LM head in a stage of its own
        apart = paced and layers < total
        before, start = staged.layer, time.perf_counter()
        deadline = start + self.pace.seconds if paced and self.deadlines else None
        with quant.dense_only():
            last = self.stages.run(staged, layers, head_apart=apart, deadline=deadline)
        if not head_only:  # the head is not in the cost model: its time teaches nothing
            spent = time.perf_counter() - start
            ran = staged.layer - before
            share = self.stages.share(staged, ran)
            # a stage its deadline cut short took the whole step: learnt from however small
            cut = ran < min(layers, total - before)
            self.pace.record(share, spent, share if cut else budget, _whole_prompts(staged.work))
        return self._finish(staged) if last else None

    @torch.inference_mode()
    def _forward(self, work: list[tuple[PrefillJob, int]]) -> Staged:
        """The whole chunk through the model in one pass."""
        if self.stages is not None:
            staged = self._begin(work)
            with quant.dense_only():
                self.stages.run(staged, len(self.stages.layers))
            return staged
        inputs, ending, keep = self._inputs(work)
        staged = Staged(work, ending, keep, inputs, torch.empty(0), 0.0)
        with quant.dense_only():
            if staged.keep is None:  # no logits wanted: the decoder alone, no LM head
                getattr(self.model, self.model.base_model_prefix)(**staged.kwargs)
            else:
                staged.logits = self.model(**staged.kwargs, logits_to_keep=staged.keep).logits
        return staged

    def _inputs(
        self, work: list[tuple[PrefillJob, int]]
    ) -> tuple[dict[str, Any], list[Piece], torch.Tensor | None]:
        """The forward's inputs for the pieces packed in one row, the pieces that complete
        their prompt, and the rows whose logits they want (None: no logits wanted)."""
        pieces: list[Piece] = []
        ids: list[int] = []
        pos: list[int] = []
        for job, n in work:
            _clear_tail(job.kv, job.done + n)
            pieces.append(Piece(job, job.done, n, len(ids)))
            ids += job.tokens[job.done : job.done + n]
            pos += range(job.done, job.done + n)
        # on the CPU no padding rows: each matmul pads its own call to a width that gives
        # every row a whole tile's bits (quant.invariant_linear, narrow.py), attention its
        # own tiles; a resent prompt's one new token paid 16 rows in every layer
        pad = 0 if self.device.type == "cpu" else max(0, MIN_ROWS - len(ids))
        ids, pos = ids + [0] * pad, pos + [0] * pad  # padding rows: attention leaves them zero
        ending = [
            p for p in pieces if p.job.seq is not None and p.start + p.length == len(p.job.tokens)
        ]
        inputs = {
            "input_ids": torch.tensor([ids], device=self.device),
            "position_ids": torch.tensor([pos], device=self.device),
            "attention_mask": torch.zeros((1, 1, 1, 1), device=self.device),  # the plan masks
            "use_cache": False,
            "prefill_plan": PrefillPlan(pieces, self.kv_heads, self.compute_dtype),
        }
        keep = None
        if ending:
            # the LM head pads them to its tile of HEAD_TILE rows, or to a narrower call where
            # this CPU gives each row the same bits (quant.HEAD_TILE, inference/narrow.py)
            rows = [p.offset + p.length - 1 for p in ending]
            keep = torch.tensor(rows, device=self.device)
        return inputs, ending, keep

    @staticmethod
    def _finish(staged: Staged) -> dict[PrefillJob, torch.Tensor]:
        """Counts the chunk's tokens as done; the logits of the prompts it completed."""
        for job, n in staged.work:
            job.done += n
        if staged.logits is None:
            return {}
        return {p.job: staged.logits[0, i] for i, p in enumerate(staged.ending)}


def _common(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of a and b."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared at C speed
        return n
    return next(i for i in range(n) if a[i] != b[i])


def _enough(shared: int, history: int) -> bool:
    """Whether a prompt sharing its first `shared` tokens with a history of `history` tokens
    continues it: all of it, or at least all its whole cache blocks (a next turn's prompt may
    tokenize the end of the reply before it otherwise than it was decoded; only the tokens
    after the ones it shares are then computed again)."""
    return shared == history or shared >= history // BLOCK * BLOCK > 0


def _whole_prompts(work: list[tuple[PrefillJob, int]]) -> bool:
    """Whether a chunk (before it is counted done) completes every prompt in it."""
    return all(n >= job.remaining for job, n in work)


def _completes_request(work: list[tuple[PrefillJob, int]]) -> bool:
    """Whether a chunk completes a request's prompt (its first token waits for the chunk)."""
    return any(job.seq is not None and n >= job.remaining for job, n in work)


def _continues(tokens: list[int], seal: PrefillJob) -> bool:
    """Whether a prompt continues a finished reply (whether or not it goes on as guessed)."""
    return _enough(_common(tokens, seal.tokens), len(seal.tokens) - seal.guessed)


def _whole_blocks(tokens: int) -> int:
    """`tokens` rounded up to whole key blocks: a buffer's capacity (its last block whole)."""
    return -(-tokens // ATTN_BLOCK) * ATTN_BLOCK


def _clear_tail(kv: torch.Tensor, end: int) -> None:
    """Zeros the positions after `end` in its key block: a chunk's queries attend their whole
    block, the keys not computed yet masked, and those must not be NaN. Only that block: the
    rest is written before it is read, so a long prompt's buffer is not zeroed (and paged in)
    all at once in its first step (~30 ms for 4,000 tokens on CPU)."""
    block_end = min(_whole_blocks(end), kv.shape[KV_TOKEN_DIM])
    if block_end > end:
        kv[:, :, :, end:block_end] = 0
