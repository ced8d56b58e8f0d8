"""The batched engine's device step: one function, static shapes per bucket, one input, one readback.

A batch is packed on the host into one flat long tensor (``pack_batch``), the
only upload of the batch:

    table [B, W], W = 3T + 5, one row per batch row (a session's work, or padding):
        ids [T] | positions [T] | parents [T] | slot | past | rows | logits_from | accept
    head [R]: flat row indices (b * T + r) the LM head runs on

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

from .device_accept import compact_kv, greedy_accept
from .engine import Work
from .engine_kv import BatchPlan, KVPool, PoolCache
from .engine_masks import ancestor_mask, mask_from_ancestors
from .target import TargetModel

FIELDS = 5  # slot, past, rows, logits_from, accept: the per-row scalars after ids | positions | parents


@dataclass(frozen=True)
class Bucket:
    """The static shape of one step."""

    batch: int  # B: batch rows (sessions' work and padding)
    tokens: int  # T: rows per batch row
    keys: int  # K: slot positions each row's attention reads
    head: int  # R: rows the LM head runs on

    @property
    def width(self) -> int:
        return 3 * self.tokens + FIELDS

    @property
    def packed(self) -> int:
        """Length of the packed input."""
        return self.batch * self.width + self.head


@dataclass
class StepOutput:
    hidden: torch.Tensor  # [B, T, E] final-norm output of every row
    logits: torch.Tensor  # [R, V] float32, the head rows in order
    readback: torch.Tensor  # [B, 2, T] long: argmax of each row (-1 without logits) | 1 where accepted


def pack_batch(items: Sequence[tuple[int, int, Work, bool]], bucket: Bucket, scratch: int,
               head: Sequence[int]) -> list[int]:
    """The flat input of one step. items: (slot, past, work, accept) per session; padding rows read and write
    the scratch slot and have no rows. head: flat head-row indices, already padded to bucket.head."""
    t = bucket.tokens
    out: list[int] = []
    for slot, past, work, accept in items:
        n = len(work)
        out += [*work.ids, *[0] * (t - n), *work.positions, *[0] * (t - n), *work.parents, *[-1] * (t - n),
                slot, past, n, work.logits_from, int(accept)]
    out += ([0] * (2 * t) + [-1] * t + [scratch, 0, 0, 0, 0]) * (bucket.batch - len(items))
    out += head
    return out


class DeviceStep:
    """The step for one target and KV pool. Call it on a packed input of a bucket's length."""

    def __init__(self, target: TargetModel, pool: KVPool, cache: PoolCache):
        self.target, self.pool, self.cache = target, pool, cache

    def __call__(self, packed: torch.Tensor, bucket: Bucket, single: int | None = None,
                 logits_out: torch.Tensor | None = None) -> StepOutput:
        """packed: [bucket.packed] long on the device. single: the slot of a one-item batch read as a view (no
        gather of its keys; eager only: a captured or compiled step would bake the slot in). logits_out: a
        float32 [R, V] buffer for the logits (see ``GraphRunner``)."""
        b, t, k = bucket.batch, bucket.tokens, bucket.keys
        pool, target = self.pool, self.target
        table = packed[:b * bucket.width].view(b, bucket.width)
        ids, positions, parents = table[:, :t], table[:, t:2 * t], table[:, 2 * t:3 * t]  # [B, T] each
        slot, past, n_rows, logits_from, accept = table[:, 3 * t:].unbind(1)  # [B] each
        head = packed[b * bucket.width:]  # [R]

        sees = ancestor_mask(parents, positions)  # [B, T, T]
        mask = mask_from_ancestors(sees, past, n_rows, k, target.dtype)  # [B, 1, T, K]
        row = torch.arange(t, device=packed.device).view(1, t)
        real = row < n_rows.view(b, 1)  # [B, T]: not padding
        write_slot = torch.where(real, slot.view(b, 1), pool.scratch)  # [B, T]
        write_pos = torch.where(real, past.view(b, 1) + row, row.clamp(max=pool.slot_tokens - 1))  # [B, T]
        self.cache.plan = BatchPlan(slot, single, write_slot, write_pos, k)
        try:
            hidden = target.decode(ids, positions, mask, self.cache)  # [B, T, E]
        finally:
            self.cache.plan = None

        logits = target.logits(hidden.reshape(b * t, -1).index_select(0, head), logits_out)  # [R, V]
        best = torch.full((b * t,), -1, dtype=torch.long, device=packed.device)
        best = best.index_copy(0, head, logits.argmax(-1)).view(b, t)  # [B, T]
        accepted = greedy_accept(ids, parents, best, logits_from, n_rows, accept.bool(), sees)  # [B, T]
        compact_kv(pool.kv, slot, past, logits_from, positions, accepted, pool.scratch)
        return StepOutput(hidden, logits, torch.stack([best, accepted.long()], 1))
