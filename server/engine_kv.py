"""The pre-allocated KV pool: one slot per session, allocated once, never grown.

All keys and values live in one tensor ``[L, 2, slots + 1, H_kv, S_max, D]``
allocated at start from a memory budget; a session holds a slot (``SlotKV``)
from its first job (taken on the caller's thread, ``reserve``) until it is
closed or dropped. The extra slot is scratch: padding rows of a batch write
there.

A forward writes each batch row's new K/V at that row's own slot and
positions, through ``PoolCache``, a transformers ``Cache`` the model calls
``update`` on like any other: it writes, then hands the attention the keys and
values of the batch's slots up to ``key_len`` (the longest used length rounded
to a bucket, so a CPU's attention does not pay for S_max). Keeping the accepted
rows copies them behind the past within the slot; cropping only moves the
length. Nothing is reallocated.
"""
from __future__ import annotations

import gc
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from edgespec.shared.kv import SessionKV, keep_rows_of, rows_kv

from .errors import SessionCapError


class KVPool:
    """Slots of KV for every layer, in one tensor; a free list hands them out."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, slots: int, slot_tokens: int,
                 dtype: torch.dtype, device: torch.device, wait_s: float = 10.0):
        if slots < 1:
            raise ValueError("a KV pool needs at least one slot")
        self.slots = slots
        self.slot_tokens = slot_tokens  # S_max: most tokens one slot holds
        self.wait_s = wait_s  # how long acquire waits for a slot to free before refusing
        with torch.no_grad():  # a plain tensor, not an inference one: a compiled step may take it as an input
            # kv: [L, 2, slots + 1, H_kv, S_max, D]; zeros so that never-written keys are finite (a masked
            # column must not bring a NaN into the softmax)
            self.kv = torch.zeros(num_layers, 2, slots + 1, kv_heads, slot_tokens, head_dim, dtype=dtype,
                                  device=device)
        self.scratch = slots  # the slot padding rows write to
        self.slot_bytes = self.kv[:, :, 0].nbytes
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._cv = threading.Condition(threading.RLock())  # re-entrant: a finaliser may run inside acquire

    @staticmethod
    def bytes_per_slot(num_layers: int, kv_heads: int, head_dim: int, slot_tokens: int, dtype: torch.dtype) -> int:
        """Keys and values of every layer for slot_tokens tokens."""
        return 2 * num_layers * kv_heads * slot_tokens * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def free(self) -> int:
        with self._cv:
            return len(self._free)

    def acquire(self) -> int:
        """A free slot; waits up to wait_s for one (sessions dropped, API generations ending), then refuses."""
        with self._cv:
            if not self._free:
                gc.collect()  # a dropped session in a reference cycle frees its slot only when collected
            if not self._cv.wait_for(lambda: self._free, timeout=self.wait_s):
                raise SessionCapError(
                    f"all {self.slots} KV slots are in use; close finished sessions, retry later, or give the "
                    f"server more KV memory (--max-kv-gb)")
            return self._free.pop()

    def release(self, slot: int) -> None:
        with self._cv:
            self._free.append(slot)
            self._cv.notify()


class SlotKV(SessionKV):
    """One session's KV: a pool slot (taken on the first forward) and how many of its positions are held."""

    def __init__(self, pool: KVPool):
        self.pool = pool
        self.slot: int | None = None
        self.length = 0
        self._release = None

    def ensure_slot(self) -> int:
        if self.slot is None:
            self.slot = self.pool.acquire()
            # freed when the session is dropped with it, whoever drops it (close, expiry, eviction)
            self._release = weakref.finalize(self, self.pool.release, self.slot)
        return self.slot

    def reserve(self) -> None:
        self.ensure_slot()

    def __len__(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def keep_rows(self, past_len: int, rows: Sequence[int]) -> None:
        if self.slot is not None:
            # [L, 2, H_kv, S_max, D] of this slot: every layer's rows move in one copy
            keep_rows_of(self.pool.kv[:, :, self.slot], past_len, rows)
        self.length = past_len + len(rows)

    def layer_kv(self, start: int, end: int) -> torch.Tensor:
        kv = self.pool.kv[:, :, self.slot]  # [L, 2, H_kv, S_max, D]
        return rows_kv(list(kv[:, 0]), list(kv[:, 1]), start, end)

    @property
    def nbytes(self) -> int:
        return self.pool.slot_bytes  # a slot is reserved whole, whatever its length

    def close(self) -> None:
        if self._release is not None:
            self._release()  # runs once: the finaliser is then dead
        self.slot, self.length, self._release = None, 0, None


@dataclass
class BatchPlan:
    """Where one forward's rows go in the pool and what the attention reads back."""

    slots: torch.Tensor  # [B] long: each batch row's slot
    single: int | None  # the slot when B == 1, read as a view with no gather (eager steps only: a captured or
    # compiled step would bake the slot in)
    write_slot: torch.Tensor  # [B, T] long: slot each new row is written to (scratch for padding)
    write_pos: torch.Tensor  # [B, T] long: position within that slot
    key_len: int  # keys the attention reads per row: [0, key_len) of its slot


class _PoolLayer(CacheLayerMixin):
    """One layer's view of the pool, for one forward at a time (``PoolCache.plan``)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, cache: "PoolCache", index: int):
        super().__init__()
        self._cache = cache
        self.keys, self.values = cache.pool.kv[index, 0], cache.pool.kv[index, 1]  # [slots + 1, H_kv, S_max, D]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # allocated with the pool

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [B, H_kv, T, D]; returns keys, values [B, H_kv, key_len, D]."""
        plan = self._cache.plan
        # indexed by [B, T] at dims 0 and 2, the target is [B, T, H_kv, D]
        self.keys[plan.write_slot, :, plan.write_pos] = key_states.transpose(1, 2)
        self.values[plan.write_slot, :, plan.write_pos] = value_states.transpose(1, 2)
        if plan.single is not None:
            s = plan.single
            return self.keys[s:s + 1, :, :plan.key_len], self.values[s:s + 1, :, :plan.key_len]
        return (self.keys[:, :, :plan.key_len].index_select(0, plan.slots),
                self.values[:, :, :plan.key_len].index_select(0, plan.slots))

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cache.plan.key_len, 0

    def get_seq_length(self) -> int:
        return self._cache.plan.key_len - self._cache.plan.write_pos.shape[1]

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class PoolCache(Cache):
    """The pool as a transformers Cache: set ``plan`` before each forward."""

    def __init__(self, pool: KVPool, num_layers: int):
        self.pool = pool
        self.plan: BatchPlan | None = None
        super().__init__(layers=[_PoolLayer(self, i) for i in range(num_layers)])


def pool_slot_tokens(max_context_tokens: int, max_tree_nodes: int, step: int = 64) -> int:
    """S_max: the longest context plus one tree's rows ([root] + nodes sit behind the past until kept)."""
    return math.ceil((max_context_tokens + max_tree_nodes + 1) / step) * step
