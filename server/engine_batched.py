"""BatchedEngine: one forward for every session's work, their KV in a pre-allocated pool.

A batch is B items (sessions' prefill chunks, trees, resume chains, plain-API
decode steps), padded to the longest. The host packs everything the step needs
into one long tensor and sends it in one copy (``engine_step``); the mask,
write positions, LM head, argmax, greedy acceptance and KV compaction happen
on the device, and one small tensor comes back. The model writes each row's
K/V into its session's slot (``PoolCache``) and reads its slot's keys up to the
bucket's key length. Each item gets its own rows back: the hidden states of
all its rows, logits of the rows it asked for, their argmax, and with
``Work.accept`` the accepted path (its KV already kept).

With ``shape_buckets`` a batch is padded to a grid bucket (powers of two of
sessions and rows, coarse key lengths), so a few static shapes serve every
batch and each can be captured once as a CUDA graph (``engine_graphs``).

Results do not depend on what else is in the batch: a row attends only its
own slot's keys, and masked keys weigh exactly zero.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from edgespec.shared.kv import SessionKV
from edgespec.shared.tree import MAX_NODES

from .device_accept import accepted_nodes
from .engine import Engine, ForwardOutput, Work
from .engine_graphs import CompiledRunner, EagerRunner, GraphRunner
from .engine_kv import KVPool, PoolCache, SlotKV, pool_slot_tokens
from .engine_masks import round_up
from .engine_step import Bucket, DeviceStep, pack_batch
from .engine_timing import ForwardTimer
from .errors import InvalidRequestError
from .target import TargetModel


API_SLOTS = 8  # slots a server adds to max_sessions for plain-API generations running at once


@dataclass(frozen=True)
class PoolConfig:
    """How big the KV pool is, and how the device step runs."""

    max_kv_bytes: int = 8 << 30  # memory of all slots together (ServerConfig.max_kv_bytes, --max-kv-gb)
    max_slots: int = 72  # slots worth allocating: sessions + plain-API generations held at once (a server
    # asks for max_sessions + API_SLOTS)
    max_context_tokens: int = 4096  # tokens of one session's context (the slot adds a tree's rows to it)
    max_tree_nodes: int = MAX_NODES  # nodes of the largest tree a slot must take behind its context
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


class BatchedEngine(Engine):
    name = "batched"

    def __init__(self, target: TargetModel, config: PoolConfig = PoolConfig()):
        super().__init__(target)
        self.config = config
        fit, slot_tokens, _ = self.slots_that_fit(target, config)
        slots = min(config.max_slots, fit)
        if slots < 2:
            raise ValueError(f"the KV budget ({config.max_kv_bytes / 2**30:.2f} GiB) holds fewer than two slots of "
                             f"{slot_tokens} tokens (and the scratch slot); raise --max-kv-gb or lower --max-context")
        self.pool = KVPool(target.num_layers, target.num_kv_heads, target.head_dim, slots, slot_tokens,
                           target.dtype, target.device)
        self.cache = PoolCache(self.pool, target.num_layers)
        self.key_buckets = key_buckets(slot_tokens, config.first_key_bucket, config.key_growth)
        self.step = DeviceStep(target, self.pool, self.cache)
        self.timer = ForwardTimer(target.device)
        if config.compile_backend:
            self.runner = CompiledRunner(self.step, config.compile_backend)
        elif config.graphs and config.shape_buckets and target.device.type == "cuda":
            self.runner = GraphRunner(self.step, grid(config, self.pool.slot_tokens))
        else:
            self.runner = EagerRunner(self.step)

    @staticmethod
    def slots_that_fit(target: TargetModel, config: PoolConfig) -> tuple[int, int, int]:
        """(slots the budget holds, tokens a slot holds, bytes a slot takes)."""
        slot_tokens = pool_slot_tokens(config.max_context_tokens, config.max_tree_nodes, config.key_bucket)
        slot_bytes = KVPool.bytes_per_slot(target.num_layers, target.num_kv_heads, target.head_dim, slot_tokens,
                                           target.dtype)
        return max(0, config.max_kv_bytes // slot_bytes - 1), slot_tokens, slot_bytes

    def describe(self) -> str:
        p = self.pool
        shapes = "shape buckets" if self.config.shape_buckets else "exact shapes"
        if isinstance(self.runner, GraphRunner):
            shapes += f", {len(self.runner.graphs)} graphs captured in {self.runner.capture_s:.1f} s"
        return (f"batched (KV pool: {p.slots} slots x {p.slot_tokens} tokens, "
                f"{p.kv.nbytes / 2**30:.2f} GiB on {p.kv.device}; step: {self.runner.kind}, {shapes})")

    def session_kv_bytes(self, budget: int) -> int:
        """Sessions report a whole slot each; the store evicts the least recently used past all slots but
        one, so the next Open finds a free slot (it takes it before it joins the store)."""
        return (self.pool.slots - 1) * self.pool.slot_bytes

    def new_kv(self) -> SlotKV:
        return SlotKV(self.pool)

    def check(self, kv: SessionKV, work: Work) -> None:
        if len(kv) + len(work) > self.pool.slot_tokens:
            raise InvalidRequestError(f"a session would hold {len(kv) + len(work)} tokens of KV; a slot holds "
                                      f"{self.pool.slot_tokens}")

    def cost(self, items: Sequence[Work]) -> int:
        b, t = len(items), max((len(w) for w in items), default=0)
        if self.config.shape_buckets and t <= bucket_rows(self.config):
            b, t = _pow2(b), _pow2(t)
        return b * t  # padded rows are computed too

    def bucket(self, works: Sequence[Work], end: int) -> tuple[Bucket, bool]:
        """The step's shape for these items, and whether it is a grid bucket (else: the batch's own shape).
        end: the longest slot length the batch reaches (keys to read)."""
        b, t = len(works), max(len(w) for w in works)
        cfg = self.config
        if cfg.shape_buckets and t <= bucket_rows(cfg) and _pow2(b) <= cfg.max_batch:
            b, t = _pow2(b), _pow2(t)
            keys = next(k for k in self.key_buckets if k >= end)
            return Bucket(b, t, keys, b * t), True
        keys = min(round_up(end, cfg.key_bucket), self.pool.slot_tokens)
        return Bucket(b, t, keys, sum(len(w) - w.logits_from for w in works)), False

    @torch.no_grad()  # not inference_mode: a compiled step cannot take inference tensors (aot_autograd)
    def run(self, items: Sequence[tuple[SessionKV, Work]]) -> list[ForwardOutput]:
        t0 = time.perf_counter_ns()
        kvs = [kv for kv, _ in items]
        works = [w for _, w in items]
        slots = [kv.ensure_slot() for kv in kvs]
        assert len(set(slots)) == len(slots), "one session's work twice in one batch"
        past = [len(kv) for kv in kvs]
        end = max(p + len(w) for p, w in zip(past, works))  # items were checked (``check``) before they queued
        bucket, in_grid = self.bucket(works, end)
        t = bucket.tokens
        if in_grid:  # the head over every row of the bucket: one static index
            head = list(range(bucket.head))
            offsets = [i * t + w.logits_from for i, w in enumerate(works)]
        else:
            head = [i * t + r for i, w in enumerate(works) for r in range(w.logits_from, len(w))]
            offsets = list(itertools.accumulate((len(w) - w.logits_from for w in works[:-1]), initial=0))
        flat = pack_batch([(s, p, w, w.accept) for s, p, w in zip(slots, past, works)], bucket, self.pool.scratch,
                          head)
        single = slots[0] if bucket.batch == 1 and not in_grid else None
        t1 = time.perf_counter_ns()
        self.timer.start()
        out = self.runner(flat, bucket, single)
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


def key_buckets(slot_tokens: int, first: int, growth: int) -> list[int]:
    """Key lengths of the grid: first, first * growth, ... and the whole slot last."""
    keys, k = [], first
    while k < slot_tokens:
        keys.append(k)
        k *= growth
    return keys + [slot_tokens]


def grid(config: PoolConfig, slot_tokens: int) -> list[Bucket]:
    """Every grid bucket: powers of two of sessions and rows within the limits, times the key buckets."""
    out = []
    for b in _powers(min(config.max_batch, config.max_slots)):
        for t in _powers(min(bucket_rows(config), config.max_batch_rows // b)):
            out += [Bucket(b, t, k, b * t) for k in key_buckets(slot_tokens, config.first_key_bucket,
                                                                config.key_growth)]
    return out


def bucket_rows(config: PoolConfig) -> int:
    """Most rows of one session a grid bucket holds."""
    return config.bucket_tokens or _pow2(config.max_tree_nodes + 1)


def _powers(limit: int) -> list[int]:
    """1, 2, 4, ... up to the power of two that holds limit."""
    return [1 << k for k in range(_pow2(limit).bit_length())]


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
