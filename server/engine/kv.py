"""The paged KV pool: fixed-size blocks, a block table per session, allocated as a session grows.

All keys and values live in one tensor ``[L, 2, H_kv, P, D]`` allocated at start from a memory budget,
P = (blocks + 1) x block_size positions: block b holds positions [b * block_size, (b + 1) * block_size).
This is vLLM's layout in spirit (a block table maps a session's logical positions to physical blocks);
the head axis comes before the positions so that one layer's keys are a plain [1, H_kv, P, D] view, which
an attention kernel reads in place (``attention``). The last block is scratch: padding rows write
there, and rows that stay put in a compaction copy it onto itself.

A session's KV (``PagedKV``) holds a list of blocks and a length; ``grow_to`` takes blocks from the
pool's free list as the session's rows need them (the engine asks before a batch runs, so a short pool
fails that session's work alone), ``crop`` gives back the blocks past the new length, and ``close``
(or dropping the session, whoever drops it: close, expiry, eviction) gives back all of them.

Blocks are reference counted: the prefix cache shares a finished session's full blocks with the sessions
that start with the same tokens instead of copying them (``prefix.kv``). A shared block is never written:
every write lands at a position at or past the session's length, and a restored prefix's partial last
block is a private copy; a crop below a shared block's end makes that block private first (copy on write).

A forward writes each row's K/V at its physical position through ``PoolCache``, a transformers ``Cache``
the model calls ``update`` on like any other. With the pool attention (``attention``) update hands
back the whole layer, which the attention reads through the batch's block tables; otherwise (SDPA, eager
attention) it gathers each batch row's keys in logical order up to ``key_len``.
"""
from __future__ import annotations

import gc
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from edgespec.server.errors import SessionCapError
from edgespec.shared.kv import SessionKV, rows_kv

BLOCK_SIZE = 16  # tokens a block holds (vLLM's default): small enough that a session wastes little, large enough
# that a block table stays short (2,048 entries at a 32k context)


class KVPool:
    """Blocks of KV for every layer in one tensor; a free list and reference counts hand them out."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device):
        if blocks < 1:
            raise ValueError("a KV pool needs at least one block")
        self.blocks = blocks
        self.block_size = block_size
        with torch.no_grad():  # a plain tensor, not an inference one: a compiled step may take it as an input
            # zeros, so that never-written keys are finite (a masked column must not bring a NaN into the softmax)
            self.kv = torch.zeros(num_layers, 2, kv_heads, (blocks + 1) * block_size, head_dim, dtype=dtype,
                                  device=device)
        self.scratch = blocks  # the block padding rows write to
        self.block_bytes = self.kv[:, :, :, :block_size].nbytes
        self.refs = [0] * blocks
        self._free = list(range(blocks - 1, -1, -1))  # popped from the end: block 0 first
        self._lock = threading.RLock()  # re-entrant: a finaliser may run while this thread holds it
        self.reclaimers: list[Callable[[], bool]] = []  # called when short of blocks: each frees what it can
        # spare (the prefix cache's least recently used prefix) and says whether it freed anything
        self.preemptors: list[Callable[[], bool]] = []  # called when the reclaimers could not free enough: each
        # preempts a session whose KV can be recomputed (``PagedKV.preempt``) and says whether it did

    @staticmethod
    def bytes_per_block(num_layers: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> int:
        """Keys and values of every layer for one block."""
        return 2 * num_layers * kv_heads * block_size * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    @property
    def used(self) -> int:
        return self.blocks - self.free

    def acquire(self, n: int) -> list[int]:
        """n free blocks (reference count 1). Short of them, the reclaimers free what they can spare, then a
        collection frees dropped sessions caught in reference cycles, then the preemptors free idle sessions'
        blocks (recomputed later); still short, a SessionCapError."""
        for attempt in range(4):
            with self._lock:
                if len(self._free) >= n:
                    out = [self._free.pop() for _ in range(n)]
                    for b in out:
                        self.refs[b] = 1
                    return out
            # outside the lock: a reclaimer takes its own lock, and its freed blocks come back through release
            if attempt == 0:
                while self.free < n and any(reclaim() for reclaim in self.reclaimers):
                    pass
            elif attempt == 1:
                gc.collect()
            elif attempt == 2:
                while self.free < n and any(preempt() for preempt in self.preemptors):
                    pass
        raise SessionCapError(f"the KV pool has {self.free} free blocks of {self.blocks} and {n} are needed; close "
                              f"finished sessions, retry later, or give the server more KV memory "
                              f"(--gpu-memory-utilization, --max-kv-gb)")

    def share(self, blocks: Sequence[int]) -> None:
        with self._lock:
            for b in blocks:
                assert self.refs[b] > 0, "sharing a free block"
                self.refs[b] += 1

    def release(self, blocks: Sequence[int]) -> None:
        with self._lock:
            for b in blocks:
                self.refs[b] -= 1
                if self.refs[b] == 0:
                    self._free.append(b)

    def positions(self, blocks: Sequence[int], start: int, end: int) -> list[int]:
        """Physical positions of logical positions [start, end) of a session with these blocks."""
        bs = self.block_size
        return [blocks[p // bs] * bs + p % bs for p in range(start, end)]

    def copy_block(self, src: int, dst: int, rows: int | None = None) -> None:
        """dst's first `rows` positions (all: None) become src's, every layer."""
        bs = self.block_size
        n = bs if rows is None else rows
        self.kv[:, :, :, dst * bs:dst * bs + n] = self.kv[:, :, :, src * bs:src * bs + n]


class PagedKV(SessionKV):
    """One session's KV: its blocks in logical order and how many positions it holds."""

    def __init__(self, pool: KVPool):
        self.pool = pool
        self.blocks: list[int] = []  # mutated in place: the finaliser holds this list
        self.length = 0
        # the token at each position, while known (None: restored from a prefix snapshot, whose tokens the KV does
        # not see): what a preempted session is recomputed from. A position's RoPE position is its index (kept
        # rows are compacted to their depth), so the tokens alone rebuild the KV.
        self.tokens: list[int] | None = []
        self.preempted = False  # its blocks were given back; the engine re-prefills ``tokens`` before its next forward
        self.pinned = False  # work of it is checked and waits for a forward: not to be preempted
        self.last_used = 0  # the engine's step count at its last forward (preemption takes the least recent)
        # the blocks go back to the pool when the session is dropped with it, whoever drops it
        self._release = weakref.finalize(self, pool.release, self.blocks)

    def reserve(self) -> None:
        pass  # blocks are taken as the session grows (``grow_to``), not up front

    def grow_to(self, tokens: int) -> None:
        """Hold blocks for `tokens` positions (what the next forward writes reaches; a preempted KV takes its whole
        length's again, which its recompute writes)."""
        need = -(-tokens // self.pool.block_size) - len(self.blocks)
        if need > 0:
            self.blocks.extend(self.pool.acquire(need))

    def __len__(self) -> int:
        return self.length

    @property
    def preemptible(self) -> bool:
        """Holds blocks it could give back and knows the tokens to recompute them from."""
        return (bool(self.blocks) and not self.pinned and not self.preempted and self.tokens is not None
                and len(self.tokens) == self.length)

    def preempt(self) -> None:
        """Give every block back and keep the length and tokens: vLLM's recompute preemption."""
        self.pool.release(self.blocks)
        self.blocks.clear()
        self.preempted = True

    def require_blocks(self) -> None:
        """Refuse to hand out positions a preempted KV does not hold (a prefix snapshot of it) until recomputed."""
        if self.preempted:
            raise SessionCapError("the session's KV was preempted for other sessions and is recomputed at its next "
                                  "forward")

    def record(self, past: int, ids: Sequence[int]) -> None:
        """The tokens at positions past.. are ids (what a forward wrote there)."""
        if self.tokens is not None and len(self.tokens) >= past:
            self.tokens[past:] = ids
        else:  # positions before these were filled without their tokens (a restored prefix): unknown from now on
            self.tokens = None

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)
        if self.tokens is not None:
            del self.tokens[self.length:]
        if self.preempted:  # no blocks to give back or to make private
            return
        bs, pool = self.pool.block_size, self.pool
        keep = -(-self.length // bs)
        if len(self.blocks) > keep:
            pool.release(self.blocks[keep:])
            del self.blocks[keep:]
        tail = self.length // bs  # the block the next write lands in, when the session holds it
        if self.length % bs and pool.refs[self.blocks[tail]] > 1:  # shared: writes would reach other sessions
            private = pool.acquire(1)[0]
            pool.copy_block(self.blocks[tail], private)
            pool.release([self.blocks[tail]])
            self.blocks[tail] = private

    def keep_rows(self, past_len: int, rows: Sequence[int]) -> None:
        rows = list(rows)
        self.require_blocks()
        if self.tokens is not None and len(self.tokens) > past_len + max(rows, default=-1):
            self.tokens[past_len:] = [self.tokens[past_len + r] for r in rows]
        else:  # rows written without their tokens (the KV filled from elsewhere): no longer recomputable
            self.tokens = None
        if rows and rows != list(range(len(rows))):
            pool = self.pool
            src = torch.tensor(pool.positions(self.blocks, past_len, past_len + max(rows) + 1), dtype=torch.long,
                               device=pool.kv.device)
            dst = torch.tensor(pool.positions(self.blocks, past_len, past_len + len(rows)), dtype=torch.long,
                               device=pool.kv.device)
            with torch.no_grad():
                pool.kv[:, :, :, dst] = pool.kv[:, :, :, src[rows]]  # gathered first: sources and targets may overlap
        self.length = past_len + len(rows)

    def layer_kv(self, start: int, end: int) -> torch.Tensor:
        self.require_blocks()
        index = torch.tensor(self.pool.positions(self.blocks, start, end), dtype=torch.long,
                             device=self.pool.kv.device)
        kv = self.pool.kv[:, :, :, index]  # [L, 2, H_kv, T, D]
        return rows_kv(list(kv[:, 0]), list(kv[:, 1]), 0, end - start)

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * self.pool.block_bytes

    def close(self) -> None:
        self.pool.release(self.blocks)
        self.blocks.clear()
        self.length = 0
        self.tokens, self.preempted, self.pinned = [], False, False


@dataclass
class BatchPlan:
    """Where one forward's rows go in the pool and what the attention reads back."""

    write_pos: torch.Tensor  # [B, T] long: physical position each new row is written to (scratch for padding)
    key_pos: torch.Tensor | None  # [B, K] long: physical position of each batch row's logical keys [0, K), for a
    # gather (SDPA); None when the attention reads the pool itself
    key_len: int  # K: logical keys each row's attention may read
    attention: object = None  # what the pool attention needs (``attention.PoolAttentionPlan``), or None


class _PoolLayer(CacheLayerMixin):
    """One layer's view of the pool, for one forward at a time (``PoolCache.plan``)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, cache: "PoolCache", index: int):
        super().__init__()
        self._cache = cache
        self.keys, self.values = cache.pool.kv[index, 0], cache.pool.kv[index, 1]  # [H_kv, P, D]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # allocated with the pool

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [B, H_kv, T, D]. Returns the whole layer [1, H_kv, P, D] for the pool
        attention, else each batch row's keys and values [B, H_kv, key_len, D] gathered in logical order."""
        plan = self._cache.plan
        # indexed by [B, T] at dim 1, the target is [H_kv, B, T, D]
        self.keys[:, plan.write_pos] = key_states.transpose(0, 1)
        self.values[:, plan.write_pos] = value_states.transpose(0, 1)
        if plan.key_pos is None:
            return self.keys[None], self.values[None]
        return self.keys[:, plan.key_pos].transpose(0, 1), self.values[:, plan.key_pos].transpose(0, 1)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cache.plan.key_len, 0

    def get_seq_length(self) -> int:
        return max(0, self._cache.plan.key_len - self._cache.plan.write_pos.shape[1])  # a batch's rows may
        # outnumber one session's keys

    def get_max_length(self) -> int:
        return self.keys.shape[1]


class PoolCache(Cache):
    """The pool as a transformers Cache: set ``plan`` before each forward."""

    def __init__(self, pool: KVPool, num_layers: int):
        self.pool = pool
        self.plan: BatchPlan | None = None
        super().__init__(layers=[_PoolLayer(self, i) for i in range(num_layers)])


def session_tokens(max_context_tokens: int, max_tree_nodes: int, block_size: int) -> int:
    """Most positions one session's blocks hold: the longest context plus one tree's rows ([root] + nodes sit
    behind the past until kept), in whole blocks."""
    return math.ceil((max_context_tokens + max_tree_nodes + 1) / block_size) * block_size
