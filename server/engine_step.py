"""The batched engine's device step: one function, static shapes per bucket, one input, one readback.

A batch is packed on the host into one flat long tensor (``pack_batch``), the
only upload of the batch:

    table [B, W], W = 3T + 4 + K / block, one row per batch row (a session's work, or padding):
        ids [T] | positions [T] | parents [T] | past | rows | logits_from | accept | blocks [K / block]
    head [R]: flat row indices (b * T + r) the LM head runs on

blocks is the session's block table (``engine_kv``) up to the bucket's key
length, padded with the scratch block.

``DeviceStep`` turns it into everything the host needs, on the device: the
mask (``engine_masks``), the KV writes (``engine_kv.PoolCache``), the decoder,
the LM head over ``head``, the argmax of every head row, greedy acceptance and
KV compaction for the items that ask (``device_accept``), and a small
``readback`` tensor [B, 2, T] (argmax per row, accepted flag per row): the
one device-to-host copy of the batch.

The shapes depend only on the ``Bucket`` (B, T, key length, R), so the step can
be captured once per bucket (``engine_graphs``) or compiled; nothing in it reads
a tensor's value on the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .device_accept import compact_kv, greedy_accept, physical
from .engine import Work
from .engine_attention import pool_block_mask
from .engine_kv import BLOCK_SIZE, BatchPlan, KVPool, PoolCache
from .engine_masks import ancestor_mask, mask_from_ancestors
from .target import TargetModel

FIELDS = 4  # past, rows, logits_from, accept: the per-row scalars after ids | positions | parents


@dataclass(frozen=True)
class Bucket:
    """The static shape of one step."""

    batch: int  # B: batch rows (sessions' work and padding)
    tokens: int  # T: rows per batch row
    keys: int  # K: logical key positions each row's attention may read (a multiple of the block size)
    head: int  # R: rows the LM head runs on
    block: int = BLOCK_SIZE  # the pool's block size (K is a multiple of it)

    @property
    def blocks(self) -> int:
        """Block-table entries per batch row."""
        return self.keys // self.block

    @property
    def width(self) -> int:
        return 3 * self.tokens + FIELDS + self.blocks

    @property
    def packed(self) -> int:
        """Length of the packed input."""
        return self.batch * self.width + self.head


@dataclass
class StepOutput:
    hidden: torch.Tensor  # [B, T, E] final-norm output of every row
    logits: torch.Tensor  # [R, V] float32, the head rows in order
    readback: torch.Tensor  # [B, 2, T] long: argmax of each row (-1 without logits) | 1 where accepted


def pack_batch(items: Sequence[tuple[Sequence[int], int, Work, bool]], bucket: Bucket, scratch: int,
               head: Sequence[int]) -> list[int]:
    """The flat input of one step. items: (blocks, past, work, accept) per session, blocks its block table
    (at least the blocks its rows reach); padding rows read and write the scratch block and have no rows.
    head: flat head-row indices, already padded to bucket.head."""
    t, mb = bucket.tokens, bucket.blocks
    out: list[int] = []
    for blocks, past, work, accept in items:
        n = len(work)
        table = list(blocks[:mb])
        out += [*work.ids, *[0] * (t - n), *work.positions, *[0] * (t - n), *work.parents, *[-1] * (t - n),
                past, n, work.logits_from, int(accept), *table, *[scratch] * (mb - len(table))]
    out += padding_rows(bucket, scratch) * (bucket.batch - len(items))
    out += head
    return out


def padding_rows(bucket: Bucket, scratch: int) -> list[int]:
    """One batch row of padding: no rows, every block the scratch block."""
    t = bucket.tokens
    return [0] * (2 * t) + [-1] * t + [0] * FIELDS + [scratch] * bucket.blocks


class DeviceStep:
    """The step for one target and KV pool. Call it on a packed input of a bucket's length."""

    def __init__(self, target: TargetModel, pool: KVPool, cache: PoolCache, attention: str = "sdpa"):
        """attention: "sdpa" (each row's keys gathered, a dense mask) or "flex" (``engine_attention``: the pool
        read in place through a block mask; the model must have been switched to it)."""
        self.target, self.pool, self.cache, self.attention = target, pool, cache, attention
        # the logical index of each block in the tables that hold it (``engine_attention``), kept on the device
        self.block_pos = torch.zeros(pool.blocks + 1, dtype=torch.long, device=pool.kv.device)

    def __call__(self, packed: torch.Tensor, bucket: Bucket, logits_out: torch.Tensor | None = None) -> StepOutput:
        """packed: [bucket.packed] long on the device. logits_out: a float32 [R, V] buffer for the logits (see
        ``GraphRunner``)."""
        b, t, k, bs = bucket.batch, bucket.tokens, bucket.keys, bucket.block
        pool, target = self.pool, self.target
        table = packed[:b * bucket.width].view(b, bucket.width)
        ids, positions, parents = table[:, :t], table[:, t:2 * t], table[:, 2 * t:3 * t]  # [B, T] each
        past, n_rows, logits_from, accept = table[:, 3 * t:3 * t + FIELDS].unbind(1)  # [B] each
        blocks = table[:, 3 * t + FIELDS:]  # [B, K / block]
        head = packed[b * bucket.width:]  # [R]

        sees = ancestor_mask(parents, positions)  # [B, T, T]
        row = torch.arange(t, device=packed.device).view(1, t)
        real = row < n_rows.view(b, 1)  # [B, T]: not padding
        write_pos = torch.where(real, physical(blocks, (past.view(b, 1) + row).clamp(max=k - 1), bs),
                                pool.scratch * bs + row % bs)  # [B, T]
        if self.attention == "flex":  # the pool read in place: a block mask, no gather, no dense mask
            positions_p = pool.kv.shape[3]
            pad = positions_p // bs if packed.device.type == "cpu" else None
            mask = pool_block_mask(blocks, past, n_rows, sees, self.block_pos, bs, positions_p, pad)
            self.cache.plan = BatchPlan(write_pos, None, k)
        else:
            mask = mask_from_ancestors(sees, past, n_rows, k, target.dtype)  # [B, 1, T, K]
            key_pos = physical(blocks, torch.arange(k, device=packed.device).expand(b, k), bs)  # [B, K]
            self.cache.plan = BatchPlan(write_pos, key_pos, k)
        try:
            hidden = target.decode(ids, positions, mask, self.cache)  # [B, T, E]
        finally:
            self.cache.plan = None

        logits = target.logits(hidden.reshape(b * t, -1).index_select(0, head), logits_out)  # [R, V]
        best = torch.full((b * t,), -1, dtype=torch.long, device=packed.device)
        best = best.index_copy(0, head, logits.argmax(-1)).view(b, t)  # [B, T]
        accepted = greedy_accept(ids, parents, best, logits_from, n_rows, accept.bool(), sees)  # [B, T]
        compact_kv(pool.kv, blocks, past, logits_from, positions, accepted, pool.scratch, bs)
        return StepOutput(hidden, logits, torch.stack([best, accepted.long()], 1))
