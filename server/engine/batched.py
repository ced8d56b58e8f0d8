"""BatchedEngine: one forward for every session's work, their KV in a paged pool.

A batch is B items (sessions' prefill chunks, trees, resume chains, plain-API
decode steps), padded to the longest. The host packs everything the step needs
into one long tensor and sends it in one copy (``step``); the mask,
write positions, LM head, argmax, greedy acceptance and KV compaction happen
on the device, and one small tensor comes back. The model writes each row's
K/V into its session's blocks (``kv``: a block table per session,
blocks taken as it grows) and reads its session's keys up to the bucket's key
length. Each item gets its own rows back: the hidden states of all its rows,
logits of the rows it asked for, their argmax, and with ``Work.accept`` the
accepted path (its KV already kept).

The batch is one run of rows (``rows``): sessions' rows one after another, so the step's shape
is the batch's total row count, not its sessions times its longest item. With ``shape_buckets`` the rows
are padded to a grid of row counts (powers of two and the halves between them: at most a third padding)
and coarse key lengths, so a few static shapes serve every batch and each can be captured once as CUDA
graphs (``graphs``). The LM head runs on the rows whose logits are used and no others.

Results do not depend on what else is in the batch: a row attends only its
own session's keys, and masked keys weigh exactly zero.
"""
from __future__ import annotations

import itertools
import logging
import time
import weakref
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from edgespec.server.errors import InvalidRequestError
from edgespec.server.target import TargetModel
from edgespec.shared.kv import SessionKV
from edgespec.shared.wire import MAX_NODES

from .accept import accepted_nodes
from .base import Engine, ForwardOutput, Work
from .fusion import Fusion, set_fusion
from .graphs import CompiledRunner, EagerRunner, GraphRunner
from .kv import BLOCK_SIZE, KVPool, PagedKV, PoolCache, session_tokens
from .masks import round_up
from .step import Bucket, DeviceStep, pack_batch
from .timing import ForwardTimer


log = logging.getLogger("edgespec.server")

FLEX_BLOCK_SIZE = 64  # the pool's block with the pool attention (``PoolConfig.block_size``)
RECOMPUTE_CHUNK = 512  # rows of one forward re-prefilling a preempted session (the scheduler's prompt chunk)
API_SEQS = 8  # sequences a server adds to max_sessions for plain-API generations running at once


@dataclass(frozen=True)
class PoolConfig:
    """How big the KV pool is, and how the device step runs."""

    max_kv_bytes: int = 8 << 30  # memory of the whole pool (on a GPU from --gpu-memory-utilization, else
    # --max-kv-gb: ``memory``)
    max_seqs: int = 72  # sequences held at once that a bucket may batch: sessions + plain-API generations (a
    # server asks for max_sessions + API_SEQS)
    max_context_tokens: int = 4096  # tokens of one session's context (its blocks add a tree's rows to it)
    max_tree_nodes: int = MAX_NODES  # nodes of the largest tree a session may send behind its context
    block_size: int = 0  # tokens a KV block holds; 0: FLEX_BLOCK_SIZE with the pool attention (FlexAttention's
    # kernels tile the keys in 64s or 32s on a GPU, and a pool block must be a whole number of tiles), else
    # BLOCK_SIZE (vLLM's 16)
    key_bucket: int = 64  # without shape buckets, keys read per row are rounded up to a multiple of this
    shape_buckets: bool = False  # pad batches to a grid of (sessions, rows, keys) buckets (``grid``) so a
    # few static shapes serve every batch: what CUDA-graph capture needs; off on a CPU, where the padding is
    # computed for nothing
    graphs: bool = False  # capture the step once per grid bucket at start as a CUDA graph (needs shape_buckets
    # and a CUDA device; off = --enforce-eager)
    compile_backend: str | Callable | None = None  # run the step through torch.compile with this backend instead (tests,
    # and a CPU where it measures faster); None = eager or graphs
    max_batch: int = 64  # most sessions a bucket holds (SchedulerConfig.max_batch_items)
    max_batch_rows: int = 2048  # most rows (every session's together) a bucket holds
    # (SchedulerConfig.max_batch_tokens): prompt chunks replay graphs too
    first_key_bucket: int = 256  # the smallest key bucket
    key_growth: int = 4  # each key bucket this many times the last (coarse: few shapes, at most 4x the keys)
    prefix_cache_bytes: int = 0  # KV the prefix cache may keep in the pool (its blocks are the pool's)
    bf16_argmax: bool = False  # the argmax of the LM head's own output (bf16 on a GPU), not of its float32 copy
    fusion: Fusion = Fusion()  # merged projections and fused norms in the target's decoder (``fusion``)
    sdpa_grid_limit: int = 1 << 26  # with SDPA, a bucket whose dense mask (rows x sessions x keys) is larger runs
    # eagerly rather than being captured (the pool attention has no such mask)
    attention: str = "auto"  # "flex": the pool read in place through a block mask (``attention``);
    # "sdpa": each row's keys gathered with a dense mask; auto: flex on CUDA (a fused kernel), sdpa elsewhere
    # (a CPU's eager flex is the unfused reference, which reads the whole pool)

    @property
    def session_tokens(self) -> int:
        """Most positions one session's blocks reach: its context and one tree, in whole blocks."""
        return session_tokens(self.max_context_tokens, self.max_tree_nodes, self.block_size)

    def resolved(self, device_type: str) -> "PoolConfig":
        """The config with auto's choices made for a device: the attention, then the block size."""
        attention = self.attention if self.attention != "auto" else ("flex" if device_type == "cuda" else "sdpa")
        block = self.block_size or (FLEX_BLOCK_SIZE if attention == "flex" else BLOCK_SIZE)
        return replace(self, attention=attention, block_size=block)


class BatchedEngine(Engine):
    name = "batched"

    def __init__(self, target: TargetModel, config: PoolConfig = PoolConfig()):
        super().__init__(target)
        self.config = config = config.resolved(target.device.type)
        blocks, block_bytes = self.blocks_that_fit(target, config)
        one_session = config.session_tokens // config.block_size
        if blocks < one_session:
            raise ValueError(f"the KV budget ({config.max_kv_bytes / 2**30:.2f} GiB) holds {blocks} blocks of "
                             f"{config.block_size} tokens, fewer than one session of {config.session_tokens} "
                             f"tokens needs ({one_session}); raise --gpu-memory-utilization or --max-kv-gb, or "
                             f"lower --max-model-len")
        self.pool = KVPool(target.num_layers, target.num_kv_heads, target.head_dim, blocks, config.block_size,
                           target.dtype, target.device)
        self.cache = PoolCache(self.pool, target.num_layers)
        self._kvs: weakref.WeakSet[PagedKV] = weakref.WeakSet()  # every live session's KV: preemption's candidates
        # The last forward's sessions, until their jobs have run on (``release_batch``): a job reads its KV after
        # the forward (accepted rows kept, K/V features exported), so an earlier item's next work in the same
        # batch must not preempt it in between.
        self._finishing: list[PagedKV] = []
        self.pool.preemptors.append(self._preempt_one)
        self.key_buckets = key_buckets(config.session_tokens, config.first_key_bucket, config.key_growth,
                                       config.block_size)
        self.attention = config.attention
        if self.attention == "flex":
            use_pool_attention(target)
        # the model is shared (one target a process): every batched engine sets its fusions, on or off
        self.fusion = set_fusion(target.model, config.fusion)
        self.step = DeviceStep(target, self.pool, self.cache, self.attention, config.bf16_argmax)
        self.timer = ForwardTimer(target.device)
        if config.compile_backend:
            self.runner = CompiledRunner(self.step, config.compile_backend)
        elif config.graphs and config.shape_buckets and target.device.type == "cuda":
            self.runner = GraphRunner(self.step, grid(config))
        else:
            self.runner = EagerRunner(self.step)

    @staticmethod
    def blocks_that_fit(target: TargetModel, config: PoolConfig) -> tuple[int, int]:
        """(blocks of the pool besides the scratch block, bytes a block takes): what the budget holds, and no
        more than every sequence at its full reach and the prefix cache's share need (a budget far above that
        would be memory no session can use)."""
        config = config.resolved(target.device.type)
        block_bytes = KVPool.bytes_per_block(target.num_layers, target.num_kv_heads, target.head_dim,
                                             config.block_size, target.dtype)
        useful = (config.max_seqs * (config.session_tokens // config.block_size)
                  + config.prefix_cache_bytes // block_bytes)
        return max(0, min(config.max_kv_bytes // block_bytes - 1, useful)), block_bytes

    def describe(self) -> str:
        p = self.pool
        shapes = "shape buckets" if self.config.shape_buckets else "exact shapes"
        if isinstance(self.runner, GraphRunner):
            shapes += f", {len(self.runner.graphs)} graph pairs captured in {self.runner.capture_s:.1f} s"
        fused = [name for name, on in vars(self.fusion).items() if on] + (["bf16 argmax"] if self.config.bf16_argmax
                                                                           else [])
        return (f"batched (paged KV: {p.blocks} blocks of {p.block_size} tokens, "
                f"{p.kv.nbytes / 2**30:.2f} GiB on {p.kv.device}; attention: {self.attention}; "
                f"step: {self.runner.kind}, {shapes}; fused: {', '.join(fused) or 'none'})")

    def session_kv_bytes(self, budget: int) -> int:
        """Sessions report the blocks they hold; the store evicts the least recently used past the pool less
        what one full batch may still take (its rows' blocks, and a block more per session where its rows cross
        into a new one), so the next batch finds its blocks; at least half the pool. Prefix-cache blocks are
        reclaimed on demand (``KVPool.reclaimers``)."""
        cfg = self.config
        headroom = -(-cfg.max_batch_rows // cfg.block_size) + cfg.max_batch
        return max(self.pool.blocks // 2, self.pool.blocks - headroom, 1) * self.pool.block_bytes

    def new_kv(self) -> PagedKV:
        kv = PagedKV(self.pool)
        self._kvs.add(kv)
        return kv

    def _preempt_one(self) -> bool:
        """The pool is short of blocks: give back the blocks of the session that ran least recently among those
        that hold blocks, wait for no forward and know their tokens; it is re-prefilled before its next forward
        (vLLM's recompute preemption). False when no session can be preempted."""
        finishing = {id(kv) for kv in self._finishing}
        victim = min((kv for kv in list(self._kvs) if kv.preemptible and id(kv) not in finishing),
                     key=lambda kv: kv.last_used, default=None)
        if victim is None:
            return False
        log.info("KV pool short of blocks: preempting a session of %d tokens (%d blocks), recomputed at its next "
                 "forward", len(victim), len(victim.blocks))
        victim.preempt()
        self.preemptions += 1
        return True

    def check(self, kv: SessionKV, work: Work) -> None:
        """Refuse work past a session's reach, and take the blocks its rows need now: a short pool fails this
        session's work alone, before it joins a batch."""
        end = len(kv) + len(work)
        if end > self.config.session_tokens:
            raise InvalidRequestError(f"a session would hold {end} tokens of KV; one session holds at most "
                                      f"{self.config.session_tokens}")
        kv.pinned = True  # from now until its forward: another session's shortage must not preempt it
        try:
            kv.grow_to(end)
        except BaseException:
            kv.pinned = False
            raise

    def cost(self, items: Sequence[Work]) -> int:
        rows = sum(len(w) for w in items)
        if self.config.shape_buckets and rows <= self.config.max_batch_rows:
            return row_bucket(rows, self.config.max_batch_rows)
        return rows  # padded rows are computed too

    def bucket(self, works: Sequence[Work], end: int) -> tuple[Bucket, bool]:
        """The step's shape for these items, and whether it is a grid bucket (else: the batch's own shape).
        end: the longest logical length the batch reaches (keys to read)."""
        rows, cfg = sum(len(w) for w in works), self.config
        if cfg.shape_buckets and rows <= cfg.max_batch_rows:
            n = row_bucket(rows, cfg.max_batch_rows)
            bucket = Bucket(n, grid_seqs(cfg, n), next(k for k in self.key_buckets if k >= end), cfg.block_size)
            if len(works) <= bucket.seqs and in_grid(cfg, bucket):
                return bucket, True
        keys = min(round_up(round_up(end, cfg.key_bucket), cfg.block_size), cfg.session_tokens)
        return Bucket(rows, len(works), keys, cfg.block_size), False

    def run(self, items: Sequence[tuple[SessionKV, Work]]) -> list[ForwardOutput]:
        """The batch's forward, after recomputing the KV of any of its sessions that was preempted. Its sessions
        are not preempted until ``release_batch`` (or the next forward): their jobs still read their KV."""
        self._finishing = [kv for kv, _ in items]
        for kv, _ in items:
            kv.pinned = True  # a recompute below may need blocks: not from this batch's sessions
        try:
            for kv, _ in items:
                if kv.preempted:
                    self._recompute(kv)
            return self._forward(items)
        finally:
            for kv, _ in items:
                kv.pinned = False
                kv.last_used = self.times.steps

    def release_batch(self) -> None:
        self._finishing = []

    def _recompute(self, kv: PagedKV) -> None:
        """Re-prefill a preempted session's tokens into blocks of its own (``check`` took them back already for
        a scheduler's item), in chunks of RECOMPUTE_CHUNK rows."""
        tokens = list(kv.tokens)
        kv.preempted, kv.length, kv.tokens = False, 0, []
        kv.grow_to(len(tokens))
        for start in range(0, len(tokens), RECOMPUTE_CHUNK):
            self._forward([(kv, Work.chunk(tokens[start:start + RECOMPUTE_CHUNK], start, logits=False))])

    @torch.no_grad()  # not inference_mode: a compiled step cannot take inference tensors (aot_autograd)
    def _forward(self, items: Sequence[tuple[SessionKV, Work]]) -> list[ForwardOutput]:
        t0 = time.perf_counter_ns()
        kvs = [kv for kv, _ in items]
        works = [w for _, w in items]
        assert len({id(kv) for kv in kvs}) == len(kvs), "one session's work twice in one batch"
        past = [len(kv) for kv in kvs]
        for kv, p, w in zip(kvs, past, works):
            kv.grow_to(p + len(w))  # done by ``check`` for the scheduler's items already
        end = max(p + len(w) for p, w in zip(past, works))  # items were checked (``check``) before they queued
        bucket, _ = self.bucket(works, end)
        starts = list(itertools.accumulate((len(w) for w in works[:-1]), initial=0))
        head = [s + r for s, w in zip(starts, works) for r in range(w.logits_from, len(w))]
        offsets = list(itertools.accumulate((len(w) - w.logits_from for w in works[:-1]), initial=0))
        flat = pack_batch([(kv.blocks, p, w, w.accept) for kv, p, w in zip(kvs, past, works)], bucket,
                          self.pool.scratch, head)
        t1 = time.perf_counter_ns()
        self.timer.start()
        out = self.runner(flat, bucket)
        launch_ns = self.timer.stop()
        t2 = time.perf_counter_ns()
        best_rows, flag_rows = out.readback.tolist()  # the batch's one device-to-host copy: [2][N]
        t3 = time.perf_counter_ns()

        results = []
        for i, (kv, p, w) in enumerate(zip(kvs, past, works)):
            s = starts[i]
            best, flags = best_rows[s:s + len(w)], flag_rows[s:s + len(w)]
            n, lf = len(w), w.logits_from
            accepted = accepted_nodes(flags, w.positions, lf) if w.accept else None
            kv.length = p + (lf + 1 + len(accepted) if accepted is not None else n)
            kv.record(p, w.ids if accepted is None else w.ids[:lf + 1] + tuple(w.ids[lf + 1 + a] for a in accepted))
            last = lf + 1 + accepted[-1] if accepted else lf
            results.append(ForwardOutput(out.hidden[s:s + n], out.logits[offsets[i]:offsets[i] + n - lf], 0,
                                         best=best[lf:n], accepted=accepted,
                                         next_token=best[last] if accepted is not None else None))
        t4 = time.perf_counter_ns()
        times = self.times
        times.steps += 1
        times.pack_ns += t1 - t0
        times.launch_ns += launch_ns
        times.device_ns += self.timer.device_ns()
        times.readback_ns += t3 - t2
        times.items_ns += t4 - t3
        for r in results:
            r.forward_ns = t4 - t0
        return results


def use_pool_attention(target: TargetModel) -> None:
    """Switch the target's attention to the pool attention (``attention``; SDPA for every caller that does not
    pass the pool's block mask, so the same model still serves them as before)."""
    from . import attention

    attention.register()
    model = target.model
    try:
        model.set_attn_implementation(attention.NAME)
    except (AttributeError, ValueError):
        model.config._attn_implementation = attention.NAME


def key_buckets(session_tokens: int, first: int, growth: int, block: int = 1) -> list[int]:
    """Key lengths of the grid: first, first * growth, ... (each rounded up to whole blocks) and a whole session's
    reach last."""
    keys, k = [], first
    while round_up(k, block) < session_tokens:
        keys.append(round_up(k, block))
        k *= growth
    return list(dict.fromkeys(keys)) + [session_tokens]


def grid(config: PoolConfig) -> list[Bucket]:
    """Every grid bucket: each row count of ``row_sizes`` within the limit, times the key buckets (SDPA's
    largest dense masks left out: ``in_grid``)."""
    keys = key_buckets(config.session_tokens, config.first_key_bucket, config.key_growth, config.block_size)
    buckets = [Bucket(n, grid_seqs(config, n), k, config.block_size)
               for n in row_sizes(config.max_batch_rows) for k in keys]
    return [b for b in buckets if in_grid(config, b)]


def row_sizes(limit: int) -> list[int]:
    """Row counts of the grid: 1, 2, 3, 4, 6, 8, 12, ... (powers of two and the halves between, so a batch pads by
    at most a third) up to limit, and limit itself."""
    sizes = {1 << k for k in range(limit.bit_length())} | {3 << k for k in range(limit.bit_length())}
    return sorted({n for n in sizes if n < limit} | {limit})


def row_bucket(rows: int, limit: int) -> int:
    """The grid's row count for a batch of `rows` rows (at most limit)."""
    return next(n for n in row_sizes(limit) if n >= rows)


def grid_seqs(config: PoolConfig, rows: int) -> int:
    """Sessions a grid bucket of `rows` rows holds: each session has a row at least, and a batch holds at most
    max_batch sessions (and no more than the pool's sequences)."""
    return min(rows, config.max_batch, config.max_seqs)


def in_grid(config: PoolConfig, bucket: Bucket) -> bool:
    """Whether a bucket is part of the grid: always with the pool attention; with SDPA unless its dense mask
    over every session's keys is past ``sdpa_grid_limit`` (such a batch runs eagerly at its own shape)."""
    return config.attention != "sdpa" or bucket.rows * bucket.seqs * bucket.keys <= config.sdpa_grid_limit


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
