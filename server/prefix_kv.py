"""Copying a session's leading KV rows out of an engine's store and into a new session's.

The prefix cache keeps ``KVSnapshot``s: per layer, the keys and values of a token sequence's first
n positions (RoPE applied at positions 0..n-1, so they fit any later session that starts with the
same ids). The two stores the engines use:

- ``DynamicKV`` (generic engine): the snapshot takes the session's own tensors, no copy. That is
  safe because nothing writes into them again: ``DynamicCache.update`` concatenates into new
  storage, and ``keep_rows`` writes only behind the committed past, at positions >= n. Restoring
  copies (``update`` concatenates), so the new session never writes into the snapshot.
- ``SlotKV`` (batched engine): the slot's rows are copied out (the slot goes back to the pool) and
  copied into the new session's slot.

A store of another kind (sliding-window or quantized layers, a future paged pool) is reported by
``unsupported`` and the server runs without a prefix cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from edgespec.shared.kv import DynamicKV, SessionKV

from .engine_kv import SlotKV


@dataclass(frozen=True)
class KVSnapshot:
    """The KV of a token sequence's first ``length`` positions."""

    keys: tuple[torch.Tensor, ...]  # per layer [H_kv, length, D], keys after RoPE
    values: tuple[torch.Tensor, ...]  # per layer [H_kv, length, D]
    length: int  # positions held
    nbytes: int  # memory the snapshot keeps alive (what the cache's budget counts)


def unsupported(kv: SessionKV) -> str | None:
    """Why snapshots cannot be taken from or restored into this kind of KV, or None when they can."""
    from transformers.cache_utils import DynamicLayer

    if isinstance(kv, SlotKV):
        return None
    if isinstance(kv, DynamicKV):
        kinds = {type(layer).__name__ for layer in kv.cache.layers}
        if kinds and kinds <= {DynamicLayer.__name__}:
            return None
        return f"the model's cache has {sorted(kinds) or 'no declared'} layers (full-attention DynamicLayer only)"
    return f"{type(kv).__name__} is not a KV store the prefix cache knows"


@torch.inference_mode()
def take_snapshot(kv: SessionKV, length: int) -> KVSnapshot:
    """The first `length` positions of kv (which holds at least that many)."""
    if not 0 < length <= len(kv):
        raise ValueError(f"a snapshot of {length} positions from a KV holding {len(kv)}")
    if isinstance(kv, SlotKV):
        rows = kv.pool.kv[:, :, kv.slot, :, :length].clone()  # [L, 2, H_kv, n, D]: the slot goes back to the pool
        return KVSnapshot(tuple(rows[:, 0]), tuple(rows[:, 1]), length, rows.nbytes)
    assert isinstance(kv, DynamicKV)
    layers = kv.cache.layers
    held = sum(layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes() for layer in layers)
    return KVSnapshot(tuple(layer.keys[0, :, :length] for layer in layers),
                      tuple(layer.values[0, :, :length] for layer in layers), length, held)


@torch.inference_mode()
def restore_snapshot(kv: SessionKV, snapshot: KVSnapshot, length: int) -> None:
    """Make the empty kv hold the snapshot's first `length` positions (a copy of its own)."""
    if len(kv):
        raise ValueError(f"restoring a prefix into a KV that already holds {len(kv)} positions")
    if not 0 < length <= snapshot.length:
        raise ValueError(f"restoring {length} positions from a snapshot of {snapshot.length}")
    if isinstance(kv, SlotKV):
        slot = kv.ensure_slot()
        for layer, (k, v) in enumerate(zip(snapshot.keys, snapshot.values)):
            kv.pool.kv[layer, 0, slot, :, :length] = k[:, :length]
            kv.pool.kv[layer, 1, slot, :, :length] = v[:, :length]
        kv.length = length
        return
    assert isinstance(kv, DynamicKV)
    for layer, (k, v) in enumerate(zip(snapshot.keys, snapshot.values)):
        kv.cache.update(k[None, :, :length], v[None, :, :length], layer)  # [1, H_kv, length, D], concatenated: a copy
