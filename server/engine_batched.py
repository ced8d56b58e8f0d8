"""BatchedEngine: one forward for every session's work, their KV in a pre-allocated pool.

A batch is B items (sessions' prefill chunks, trees, resume chains, plain-API
decode steps), padded to the longest: ids, positions and parents [B, T]. The
host sends those small integer tensors in one copy; the mask
(``engine_masks``), write positions and read length are made on the device.
The model writes each row's K/V into its session's slot (``PoolCache``) and
reads its slot's keys up to ``key_len``. Each item gets its own rows back:
the hidden states of all its rows and logits of the rows it asked for.

Results do not depend on what else is in the batch: a row attends only its
own slot's keys, and masked keys weigh exactly zero.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from edgespec.shared.kv import SessionKV

from .engine import Engine, ForwardOutput, Work
from .engine_kv import BatchPlan, KVPool, PoolCache, SlotKV, pool_slot_tokens
from .engine_masks import batch_attention_mask, round_up
from .errors import InvalidRequestError
from .target import TargetModel


API_SLOTS = 8  # slots a server adds to max_sessions for plain-API generations running at once


@dataclass(frozen=True)
class PoolConfig:
    """How big the KV pool is."""

    max_kv_bytes: int = 8 << 30  # memory of all slots together (ServerConfig.max_kv_bytes, --max-kv-gb)
    max_slots: int = 72  # slots worth allocating: sessions + plain-API generations held at once (a server
    # asks for max_sessions + API_SLOTS)
    max_context_tokens: int = 4096  # tokens of one session's context (the slot adds a tree's rows to it)
    max_tree_nodes: int = 255  # nodes of the largest tree a slot must take behind its context
    key_bucket: int = 64  # keys read per row are rounded up to a multiple of this: fewer shapes
    shape_buckets: bool = False  # pad sessions, rows and keys up to powers of two, and read slots by index
    # even for one session: a few fixed shapes, what CUDA-graph capture per (batch, tokens) bucket needs;
    # off on a CPU, where the padding is computed for nothing


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

    @staticmethod
    def slots_that_fit(target: TargetModel, config: PoolConfig) -> tuple[int, int, int]:
        """(slots the budget holds, tokens a slot holds, bytes a slot takes)."""
        slot_tokens = pool_slot_tokens(config.max_context_tokens, config.max_tree_nodes, config.key_bucket)
        slot_bytes = KVPool.bytes_per_slot(target.num_layers, target.num_kv_heads, target.head_dim, slot_tokens,
                                           target.dtype)
        return max(0, config.max_kv_bytes // slot_bytes - 1), slot_tokens, slot_bytes

    def describe(self) -> str:
        p = self.pool
        return (f"batched (KV pool: {p.slots} slots x {p.slot_tokens} tokens, "
                f"{p.kv.nbytes / 2**30:.2f} GiB on {p.kv.device})")

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
        b, t = self._shape(len(items), max((len(w) for w in items), default=0))
        return b * t  # padded rows are computed too

    def _shape(self, b: int, t: int) -> tuple[int, int]:
        """The batch's padded [B, T]."""
        return (_pow2(b), _pow2(t)) if self.config.shape_buckets else (b, t)

    @torch.inference_mode()
    def run(self, items: Sequence[tuple[SessionKV, Work]]) -> list[ForwardOutput]:
        t0 = time.perf_counter_ns()
        target, pool = self.target, self.pool
        kvs = [kv for kv, _ in items]
        works = [w for _, w in items]
        slots = [kv.ensure_slot() for kv in kvs]
        assert len(set(slots)) == len(slots), "one session's work twice in one batch"
        past = [len(kv) for kv in kvs]
        sizes = [len(w) for w in works]
        end = max(p + n for p, n in zip(past, sizes))  # items were checked (``check``) before they queued
        b, t = self._shape(len(items), max(sizes))
        key_len = _pow2(end) if self.config.shape_buckets else round_up(end, self.config.key_bucket)
        key_len = min(key_len, pool.slot_tokens)

        # One host-to-device copy: [B, 3T + 3] = ids | positions | parents | slot, past, rows; padding
        # sessions have no rows and read the scratch slot
        rows = [_padded(w.ids, t, 0) + _padded(w.positions, t, 0) + _padded(w.parents, t, -1) + [s, p, n]
                for w, s, p, n in zip(works, slots, past, sizes)]
        rows += [[0] * (2 * t) + [-1] * t + [pool.scratch, 0, 0]] * (b - len(items))
        packed = torch.tensor(rows, dtype=torch.long)
        packed = packed.to(target.device)
        ids, positions, parents = packed[:, :t], packed[:, t:2 * t], packed[:, 2 * t:3 * t]  # [B, T] each
        slot_t, past_t, rows_t = packed[:, 3 * t], packed[:, 3 * t + 1], packed[:, 3 * t + 2]  # [B] each

        mask = batch_attention_mask(parents, positions, past_t, rows_t, key_len, target.dtype)  # [B, 1, T, keys]
        row = torch.arange(t, device=target.device).view(1, t)
        real = row < rows_t.view(b, 1)  # [B, T]: not padding
        write_slot = torch.where(real, slot_t.view(b, 1), pool.scratch)  # [B, T]
        write_pos = torch.where(real, past_t.view(b, 1) + row, row.clamp(max=pool.slot_tokens - 1))  # [B, T]
        single = slots[0] if b == 1 and not self.config.shape_buckets else None
        self.cache.plan = BatchPlan(slot_t, single, write_slot, write_pos, key_len)
        try:
            hidden = target.decode(ids, positions, mask, self.cache)  # [B, T, E]
        finally:
            self.cache.plan = None
        for kv, p, n in zip(kvs, past, sizes):
            kv.length = p + n

        # The LM head once, on the rows asked for: [R, V]
        wanted = [i * t + r for i, w in enumerate(works) for r in range(w.logits_from, len(w))]
        flat = hidden.reshape(b * t, -1)
        logits = target.logits(flat[torch.tensor(wanted, dtype=torch.long, device=flat.device)])
        counts = [len(w) - w.logits_from for w in works]
        forward_ns = time.perf_counter_ns() - t0
        return [ForwardOutput(hidden[i, :n], part, forward_ns, batch=b)
                for i, (n, part) in enumerate(zip(sizes, logits.split(counts)))]


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _padded(values: Sequence[int], length: int, fill: int) -> list[int]:
    return list(values) + [fill] * (length - len(values))
