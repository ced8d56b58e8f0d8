"""Copying a session's leading KV rows out of an engine's store and into a new session's.

The prefix cache keeps ``KVSnapshot``s: per layer, the keys and values of a token sequence's first
n positions (RoPE applied at positions 0..n-1, so they fit any later session that starts with the
same ids). The two stores the engines use:

- ``DynamicKV`` (generic engine): the snapshot takes the session's own tensors, no copy. That is
  safe because nothing writes into them again: ``DynamicCache.update`` concatenates into new
  storage, and ``keep_rows`` writes only behind the committed past, at positions >= n. Restoring
  copies (``update`` concatenates), so the new session never writes into the snapshot.
- ``PagedKV`` (batched engine): blocks are shared, not copied (``BlockSnapshot``). The snapshot takes a
  reference on each full block of the prefix (the session may go on or end: a block lives while anyone
  holds it) and a private copy of a partial last block, which the session would write on; a restore
  shares the full blocks into the new session's table the same way and copies the partial block's rows
  into a block of its own. A shared block is never written (``engine.kv``).

A store of another kind (sliding-window or quantized layers) is reported by ``unsupported`` and the
server runs without a prefix cache.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from edgespec.server.engine.kv import KVPool, PagedKV
from edgespec.shared.kv import DynamicKV, SessionKV


@dataclass(frozen=True)
class KVSnapshot:
    """The KV of a token sequence's first ``length`` positions."""

    keys: tuple[torch.Tensor, ...]  # per layer [H_kv, length, D], keys after RoPE
    values: tuple[torch.Tensor, ...]  # per layer [H_kv, length, D]
    length: int  # positions held
    nbytes: int  # memory the snapshot keeps alive (what the cache's budget counts)


class BlockSnapshot:
    """The first ``length`` positions of a paged session: blocks of the pool, held by reference (the last one a
    private copy when the prefix ends inside it). The blocks go back when the snapshot is dropped."""

    def __init__(self, pool: KVPool, blocks: list[int], length: int):
        self.pool, self.blocks, self.length = pool, blocks, length
        self.nbytes = len(blocks) * pool.block_bytes  # pool memory the snapshot keeps from sessions
        weakref.finalize(self, pool.release, blocks)


def unsupported(kv: SessionKV) -> str | None:
    """Why snapshots cannot be taken from or restored into this kind of KV, or None when they can."""
    from transformers.cache_utils import DynamicLayer

    if isinstance(kv, PagedKV):
        return None
    if isinstance(kv, DynamicKV):
        kinds = {type(layer).__name__ for layer in kv.cache.layers}
        if kinds and kinds <= {DynamicLayer.__name__}:
            return None
        return f"the model's cache has {sorted(kinds) or 'no declared'} layers (full-attention DynamicLayer only)"
    return f"{type(kv).__name__} is not a KV store the prefix cache knows"


@torch.inference_mode()
def take_snapshot(kv: SessionKV, length: int) -> KVSnapshot | BlockSnapshot:
    """The first `length` positions of kv (which holds at least that many). A paged pool short of a block for a
    partial last block raises ``SessionCapError``."""
    if not 0 < length <= len(kv):
        raise ValueError(f"a snapshot of {length} positions from a KV holding {len(kv)}")
    if isinstance(kv, PagedKV):
        kv.require_blocks()  # a preempted session's positions are recomputed at its next forward, not held now
        return BlockSnapshot(kv.pool, _share_prefix(kv.pool, kv.blocks, length), length)
    assert isinstance(kv, DynamicKV)
    layers = kv.cache.layers
    held = sum(layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes() for layer in layers)
    return KVSnapshot(tuple(layer.keys[0, :, :length] for layer in layers),
                      tuple(layer.values[0, :, :length] for layer in layers), length, held)


@torch.inference_mode()
def restore_snapshot(kv: SessionKV, snapshot: KVSnapshot | BlockSnapshot, length: int) -> None:
    """Make the empty kv hold the snapshot's first `length` positions (shared full blocks and a copy of the
    partial one on a paged pool; a copy of its own on a DynamicCache)."""
    if len(kv):
        raise ValueError(f"restoring a prefix into a KV that already holds {len(kv)} positions")
    if not 0 < length <= snapshot.length:
        raise ValueError(f"restoring {length} positions from a snapshot of {snapshot.length}")
    if isinstance(kv, PagedKV):
        assert isinstance(snapshot, BlockSnapshot) and not kv.blocks
        kv.blocks.extend(_share_prefix(kv.pool, snapshot.blocks, length))
        kv.length = length
        return
    assert isinstance(kv, DynamicKV)
    for layer, (k, v) in enumerate(zip(snapshot.keys, snapshot.values)):
        kv.cache.update(k[None, :, :length], v[None, :, :length], layer)  # [1, H_kv, length, D], concatenated: a copy


def _share_prefix(pool: KVPool, blocks: list[int], length: int) -> list[int]:
    """Blocks holding the first `length` positions of a table: its full blocks shared (a reference more each),
    and a partial last block copied into a new block (whoever holds the table may write past `length` in it)."""
    full, rest = divmod(length, pool.block_size)
    out = list(blocks[:full])
    if rest:
        private = pool.acquire(1)[0]  # before sharing: a refusal here leaves every count as it was
        with torch.no_grad():
            pool.copy_block(blocks[full], private, rest)
        out.append(private)
    pool.share(out[:full])
    return out
