"""BatchedEngine: one forward for every session's work, their KV in a paged pool.

A batch is B items (sessions' prefill chunks, trees, resume chains, plain-API
decode steps), padded to the longest. The host packs everything the step needs
into one long tensor and sends it in one copy (``engine_step``); the mask,
write positions, LM head, argmax, greedy acceptance and KV compaction happen
on the device, and one small tensor comes back. The model writes each row's
K/V into its session's blocks (``engine_kv``: a block table per session,
blocks taken as it grows) and reads its session's keys up to the bucket's key
length. Each item gets its own rows back: the hidden states of all its rows,
logits of the rows it asked for, their argmax, and with ``Work.accept`` the
accepted path (its KV already kept).

With ``shape_buckets`` a batch is padded to a grid bucket (powers of two of
sessions and rows, coarse key lengths), so a few static shapes serve every
batch and each can be captured once as a CUDA graph (``engine_graphs``).

Results do not depend on what else is in the batch: a row attends only its
own session's keys, and masked keys weigh exactly zero.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from edgespec.shared.kv import SessionKV
from edgespec.shared.tree import MAX_NODES

from .device_accept import accepted_nodes
from .engine import Engine, ForwardOutput, Work
from .engine_graphs import CompiledRunner, EagerRunner, GraphRunner
from .engine_kv import BLOCK_SIZE, KVPool, PagedKV, PoolCache, session_tokens
from .engine_masks import round_up
from .engine_step import Bucket, DeviceStep, pack_batch
from .engine_timing import ForwardTimer
from .errors import InvalidRequestError
from .target import TargetModel


FLEX_BLOCK_SIZE = 64  # the pool's block with the pool attention (``PoolConfig.block_size``)
API_SEQS = 8  # sequences a server adds to max_sessions for plain-API generations running at once


@dataclass(frozen=True)
class PoolConfig:
    """How big the KV pool is, and how the device step runs."""

    max_kv_bytes: int = 8 << 30  # memory of the whole pool (on a GPU from --gpu-memory-utilization, else
    # --max-kv-gb: ``engine_memory``)
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
    max_batch_rows: int = 2048  # most rows (sessions x tokens) a bucket holds (SchedulerConfig.max_batch_tokens)
    bucket_tokens: int = 0  # most rows per session a bucket holds; longer work (prefill chunks) runs eagerly
    # at its own shape. 0: the largest tree with its root row, as a power of two, so every verification a
    # session can send replays a graph (a fixed 64 left 64-node trees eager: 35 ms against 6 on an H200)
    first_key_bucket: int = 256  # the smallest key bucket
    key_growth: int = 4  # each key bucket this many times the last (coarse: few shapes, at most 4x the keys)
    prefix_cache_bytes: int = 0  # KV the prefix cache may keep in the pool (its blocks are the pool's)
    attention: str = "auto"  # "flex": the pool read in place through a block mask (``engine_attention``);
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
        self.key_buckets = key_buckets(config.session_tokens, config.first_key_bucket, config.key_growth,
                                       config.block_size)
        self.attention = config.attention
        if self.attention == "flex":
            use_pool_attention(target)
        self.step = DeviceStep(target, self.pool, self.cache, self.attention)
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
            shapes += f", {len(self.runner.graphs)} graphs captured in {self.runner.capture_s:.1f} s"
        return (f"batched (paged KV: {p.blocks} blocks of {p.block_size} tokens, "
                f"{p.kv.nbytes / 2**30:.2f} GiB on {p.kv.device}; attention: {self.attention}; "
                f"step: {self.runner.kind}, {shapes})")

    def session_kv_bytes(self, budget: int) -> int:
        """Sessions report the blocks they hold; the store evicts the least recently used past the pool less
        what one full batch may still take (its rows' blocks, and a block more per session where its rows cross
        into a new one), so the next batch finds its blocks; at least half the pool. Prefix-cache blocks are
        reclaimed on demand (``KVPool.reclaimers``)."""
        cfg = self.config
        headroom = -(-cfg.max_batch_rows // cfg.block_size) + cfg.max_batch
        return max(self.pool.blocks // 2, self.pool.blocks - headroom, 1) * self.pool.block_bytes

    def new_kv(self) -> PagedKV:
        return PagedKV(self.pool)

    def check(self, kv: SessionKV, work: Work) -> None:
        """Refuse work past a session's reach, and take the blocks its rows need now: a short pool fails this
        session's work alone, before it joins a batch."""
        end = len(kv) + len(work)
        if end > self.config.session_tokens:
            raise InvalidRequestError(f"a session would hold {end} tokens of KV; one session holds at most "
                                      f"{self.config.session_tokens}")
        kv.grow_to(end)

    def cost(self, items: Sequence[Work]) -> int:
        b, t = len(items), max((len(w) for w in items), default=0)
        if self.config.shape_buckets and t <= bucket_rows(self.config):
            b, t = _pow2(b), _pow2(t)
        return b * t  # padded rows are computed too

    def bucket(self, works: Sequence[Work], end: int) -> tuple[Bucket, bool]:
        """The step's shape for these items, and whether it is a grid bucket (else: the batch's own shape).
        end: the longest logical length the batch reaches (keys to read)."""
        b, t = len(works), max(len(w) for w in works)
        cfg = self.config
        if cfg.shape_buckets and t <= bucket_rows(cfg) and _pow2(b) <= cfg.max_batch:
            b, t = _pow2(b), _pow2(t)
            keys = next(k for k in self.key_buckets if k >= end)
            return Bucket(b, t, keys, b * t, cfg.block_size), True
        keys = min(round_up(round_up(end, cfg.key_bucket), cfg.block_size), cfg.session_tokens)
        return Bucket(b, t, keys, sum(len(w) - w.logits_from for w in works), cfg.block_size), False

    @torch.no_grad()  # not inference_mode: a compiled step cannot take inference tensors (aot_autograd)
    def run(self, items: Sequence[tuple[SessionKV, Work]]) -> list[ForwardOutput]:
        t0 = time.perf_counter_ns()
        kvs = [kv for kv, _ in items]
        works = [w for _, w in items]
        assert len({id(kv) for kv in kvs}) == len(kvs), "one session's work twice in one batch"
        past = [len(kv) for kv in kvs]
        for kv, p, w in zip(kvs, past, works):
            kv.grow_to(p + len(w))  # done by ``check`` for the scheduler's items already
        end = max(p + len(w) for p, w in zip(past, works))  # items were checked (``check``) before they queued
        bucket, in_grid = self.bucket(works, end)
        t = bucket.tokens
        if in_grid:  # the head over every row of the bucket: one static index
            head = list(range(bucket.head))
            offsets = [i * t + w.logits_from for i, w in enumerate(works)]
        else:
            head = [i * t + r for i, w in enumerate(works) for r in range(w.logits_from, len(w))]
            offsets = list(itertools.accumulate((len(w) - w.logits_from for w in works[:-1]), initial=0))
        flat = pack_batch([(kv.blocks, p, w, w.accept) for kv, p, w in zip(kvs, past, works)], bucket,
                          self.pool.scratch, head)
        t1 = time.perf_counter_ns()
        self.timer.start()
        out = self.runner(flat, bucket)
        launch_ns = self.timer.stop()
        t2 = time.perf_counter_ns()
        readback = out.readback.tolist()  # the batch's one device-to-host copy: [B][2][T]
        t3 = time.perf_counter_ns()

        results = []
        for i, (kv, p, w) in enumerate(zip(kvs, past, works)):
            best, flags = readback[i]
            n, lf = len(w), w.logits_from
            accepted = accepted_nodes(flags, w.positions, lf) if w.accept else None
            kv.length = p + (lf + 1 + len(accepted) if accepted is not None else n)
            last = lf + 1 + accepted[-1] if accepted else lf
            results.append(ForwardOutput(out.hidden[i, :n], out.logits[offsets[i]:offsets[i] + n - lf], 0,
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
    """Switch the target's attention to ``engine_attention`` (SDPA for every caller that does not pass the pool's
    block mask, so the same model still serves them as before)."""
    from . import engine_attention

    engine_attention.register()
    model = target.model
    try:
        model.set_attn_implementation(engine_attention.NAME)
    except (AttributeError, ValueError):
        model.config._attn_implementation = engine_attention.NAME


def key_buckets(session_tokens: int, first: int, growth: int, block: int = 1) -> list[int]:
    """Key lengths of the grid: first, first * growth, ... (each rounded up to whole blocks) and a whole session's
    reach last."""
    keys, k = [], first
    while round_up(k, block) < session_tokens:
        keys.append(round_up(k, block))
        k *= growth
    return list(dict.fromkeys(keys)) + [session_tokens]


def grid(config: PoolConfig) -> list[Bucket]:
    """Every grid bucket: powers of two of sessions and rows within the limits, times the key buckets."""
    out = []
    for b in _powers(min(config.max_batch, config.max_seqs)):
        for t in _powers(min(bucket_rows(config), config.max_batch_rows // b)):
            out += [Bucket(b, t, k, b * t, config.block_size)
                    for k in key_buckets(config.session_tokens, config.first_key_bucket, config.key_growth,
                                         config.block_size)]
    return out


def bucket_rows(config: PoolConfig) -> int:
    """Most rows of one session a grid bucket holds."""
    return config.bucket_tokens or _pow2(config.max_tree_nodes + 1)


def _powers(limit: int) -> list[int]:
    """1, 2, 4, ... up to the power of two that holds limit."""
    return [1 << k for k in range(_pow2(limit).bit_length())]


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
