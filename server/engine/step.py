"""The batched engine's device step: static shapes per bucket, one input, one readback.

A batch is one run of rows (``rows``): every session's new tokens one after another, padded to the
bucket's row count N, and a table of the bucket's S sessions. The host packs it into one flat long tensor
(``pack_batch``), the only upload of the batch:

    rows [4, N]: ids | positions | parents (flat row index, -1: from the past) | session (-1: padding)
    sessions [S, W], W = FIELDS + K / block: past | rows | logits_from | accept | first row | blocks [K / block]
    head [R]: the flat rows whose logits are used (not part of the bucket: R follows the batch exactly)

blocks is the session's block table (``kv``) up to the bucket's key length, padded with the scratch
block.

``DeviceStep`` runs in three parts, so that the LM head sees only the rows whose logits are used:

- ``decode`` (bucket shape): the mask (``rows``, or the pool attention's block mask), the KV writes
  (``kv.PoolCache``) and the decoder over the N rows;
- ``head`` (exact shape): the LM head, its float32 copy and the argmax over the R head rows alone: a matmul
  and two elementwise kernels, no padded row and no prompt row without logits;
- ``finish`` (bucket shape): greedy acceptance and KV compaction for the sessions that ask, and a small
  ``readback`` tensor [2, N] (argmax per row, accepted flag per row): the one device-to-host copy.

The bucket parts depend only on the ``Bucket`` (N, S, key length), so each can be captured once per bucket
(``graphs``) or compiled; nothing in the step reads a tensor's value on the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from edgespec.server.target import TargetModel

from .attention import pool_block_mask
from .base import Work
from .kv import BLOCK_SIZE, BatchPlan, KVPool, PoolCache
from .rows import (Rows, accept_rows, compact_rows, key_positions, rows_sdpa_mask, sees_rows,
                   write_positions)

FIELDS = 5  # past, rows, logits_from, accept, first row: the per-session scalars before the block table


@dataclass(frozen=True)
class Bucket:
    """The static shape of one step."""

    rows: int  # N: rows of every session's work together, padding included
    seqs: int  # S: sessions the table holds (sessions' work and padding)
    keys: int  # K: logical key positions a session's rows may read (a multiple of the block size)
    block: int = BLOCK_SIZE  # the pool's block size (K is a multiple of it)

    @property
    def blocks(self) -> int:
        """Block-table entries per session."""
        return self.keys // self.block

    @property
    def width(self) -> int:
        """Entries of one session's table row."""
        return FIELDS + self.blocks

    @property
    def packed(self) -> int:
        """Length of the packed input the bucket's parts read (the head rows follow it)."""
        return 4 * self.rows + self.seqs * self.width


@dataclass
class StepOutput:
    hidden: torch.Tensor  # [N, E] final-norm output of every row
    logits: torch.Tensor  # [R, V] float32, the head rows in order
    readback: torch.Tensor  # [2, N] long: argmax of each row (-1 without logits) | 1 where accepted


def pack_batch(items: Sequence[tuple[Sequence[int], int, Work, bool]], bucket: Bucket, scratch: int,
               head: Sequence[int]) -> list[int]:
    """The flat input of one step. items: (blocks, past, work, accept) per session, blocks its block table
    (at least the blocks its rows reach); rows past the items' are padding, and so are sessions past them (no
    rows, every block the scratch block). head: the flat rows whose logits are used."""
    mb, pad = bucket.blocks, bucket.rows - sum(len(w) for _, _, w, _ in items)
    ids: list[int] = []
    positions: list[int] = []
    parents: list[int] = []
    seq: list[int] = []
    table: list[int] = []
    for s, (blocks, past, work, accept) in enumerate(items):
        start = len(ids)
        ids += work.ids
        positions += work.positions
        parents += [start + p if p >= 0 else -1 for p in work.parents]
        seq += [s] * len(work)
        own = list(blocks[:mb])
        table += [past, len(work), work.logits_from, int(accept), start, *own, *[scratch] * (mb - len(own))]
    table += padding_session(bucket, scratch) * (bucket.seqs - len(items))
    return [*ids, *[0] * pad, *positions, *[0] * pad, *parents, *[-1] * pad, *seq, *[-1] * pad, *table, *head]


def padding_session(bucket: Bucket, scratch: int) -> list[int]:
    """One table row of a session that is not there: no rows, every block the scratch block."""
    return [0] * FIELDS + [scratch] * bucket.blocks


def padding_batch(bucket: Bucket, scratch: int) -> list[int]:
    """A packed input of padding only (what a graph is captured on: it reads and writes the scratch block)."""
    return pack_batch([], bucket, scratch, [])


def unpack(packed: torch.Tensor, bucket: Bucket) -> Rows:
    """The step's tensors: views of the packed input."""
    n, s = bucket.rows, bucket.seqs
    ids, positions, parents, seq = packed[:4 * n].view(4, n)
    table = packed[4 * n:bucket.packed].view(s, bucket.width)
    past, n_rows, logits_from, accept, start = table[:, :FIELDS].unbind(1)
    return Rows(ids, positions, parents, seq, past, n_rows, logits_from, accept.bool(), start, table[:, FIELDS:])


class DeviceStep:
    """The step for one target and KV pool. Call it on a packed input of a bucket's length and its head rows."""

    def __init__(self, target: TargetModel, pool: KVPool, cache: PoolCache, attention: str = "sdpa",
                 bf16_argmax: bool = False):
        """attention: "sdpa" (each session's keys gathered, a dense mask) or "flex" (``attention``: the pool
        read in place through a block mask; the model must have been switched to it). bf16_argmax: take the
        argmax of the head's own output (bf16 on a GPU) rather than of its float32 copy: half the bytes read, and
        the same answer (the copy holds the bf16 values exactly; with a softcap, the larger raw value where the
        capped float32 values would tie). The float32 copy is still made, for whoever reads the logits."""
        self.target, self.pool, self.cache, self.attention = target, pool, cache, attention
        self.bf16_argmax = bf16_argmax
        self.lm_head = target.model.get_output_embeddings()
        # the logical index of each block in the tables that hold it (``attention``), kept on the device
        self.block_pos = torch.zeros(pool.blocks + 1, dtype=torch.long, device=pool.kv.device)

    def __call__(self, packed: torch.Tensor, bucket: Bucket) -> StepOutput:
        """The three parts in a row: packed is [bucket.packed + R] long on the device, the head rows last."""
        hidden, sees = self.decode(packed, bucket)
        logits, best = self.head(hidden, packed[bucket.packed:])
        return StepOutput(hidden, logits, self.finish(packed, bucket, sees, best))

    def decode(self, packed: torch.Tensor, bucket: Bucket) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder over the bucket's rows, each row's K/V written to its session's blocks: (hidden [N, E],
        the rows' ancestor mask [N, N], which acceptance reuses). packed: at least bucket.packed long."""
        k, bs, pool = bucket.keys, bucket.block, self.pool
        rows = unpack(packed, bucket)
        sees = sees_rows(rows)
        write_pos = write_positions(rows, k, pool.scratch, bs).view(1, -1)
        if self.attention == "flex":  # the pool read in place: a block mask, no gather, no dense mask
            mask = pool_block_mask(rows, sees, self.block_pos, bs, pool.kv.shape[3])
            self.cache.plan = BatchPlan(write_pos, None, k)
        else:  # every session's keys gathered one after another, a dense mask over them
            mask = rows_sdpa_mask(rows, sees, k, self.target.dtype)
            self.cache.plan = BatchPlan(write_pos, key_positions(rows, k, bs), bucket.seqs * k)
        try:
            hidden = self.target.decode(rows.ids.view(1, -1), rows.positions.view(1, -1), mask, self.cache)
        finally:
            self.cache.plan = None
        return hidden[0], sees

    def head(self, hidden: torch.Tensor, head: torch.Tensor,
             best: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The LM head on the head rows alone: (float32 logits [R, V], best [N] with -1 off the head rows).
        best: a [N] long buffer to write the argmax into (a captured ``finish`` reads it from there)."""
        picked = hidden.index_select(0, head)
        if self.bf16_argmax:  # softcapping (tanh) keeps the order, so the raw output's argmax is the logits'
            raw = self.lm_head(picked)
            best_head, logits = raw.argmax(-1), raw.float()
            if self.target.logit_softcap is not None:
                logits = torch.tanh(logits / self.target.logit_softcap) * self.target.logit_softcap
        else:
            logits = self.target.logits(picked)
            best_head = logits.argmax(-1)
        if best is None:
            best = torch.empty(hidden.shape[0], dtype=torch.long, device=hidden.device)
        return logits, best.fill_(-1).index_copy_(0, head, best_head)

    def finish(self, packed: torch.Tensor, bucket: Bucket, sees: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
        """Greedy acceptance and KV compaction for the sessions that ask; the readback [2, N]."""
        rows = unpack(packed, bucket)
        accepted = accept_rows(rows, best, sees)
        compact_rows(self.pool.kv, rows, accepted, self.pool.scratch, bucket.block)
        return torch.stack([best, accepted.long()])
