"""Greedy acceptance and KV compaction on the device, over a batch's run of rows (``engine.rows``), equal the host's
reference (shared.verification, shared.kv)."""
from __future__ import annotations

import random

import pytest
import torch

from edgespec.server.engine.accept import accepted_nodes
from edgespec.server.engine.base import Work
from edgespec.server.engine.rows import accept_rows, compact_rows, sees_rows
from edgespec.server.engine.step import Bucket, pack_batch, unpack
from edgespec.shared.kv import keep_rows_of
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.verification import greedy_walk


def _tree(rng: random.Random, n: int) -> DraftTree:
    """Random tree over a tiny vocabulary, so siblings often share a token (the first one must win)."""
    parents = tuple(rng.choice([ROOT] + list(range(i))) for i in range(n))
    return DraftTree(tuple(rng.randrange(3) for _ in range(n)), parents)


def _rows(rng: random.Random, works: list[Work], pasts: list[int], accept: list[bool], tables: list[list[int]],
          bs: int, scratch: int):
    """The step's rows for these works (two padding rows, a padding session after them) and a random argmax at
    every row with logits (-1 elsewhere); (rows, best, each work's first row)."""
    mb = len(tables[0])
    total = sum(len(w) for w in works)
    bucket = Bucket(total + 2, len(works) + 1, mb * bs, bs)
    rows = unpack(torch.tensor(pack_batch(list(zip(tables, pasts, works, accept)), bucket, scratch, [])), bucket)
    starts = [sum(len(v) for v in works[:i]) for i in range(len(works))]
    best = [rng.randrange(3) if r >= w.logits_from else -1 for w in works for r in range(len(w))] + [-1, -1]
    return rows, torch.tensor(best), starts


@pytest.mark.parametrize("seed", range(30))
def test_device_acceptance_equals_the_greedy_walk(seed):
    """Every session of a batch (trees after a causal chunk or alone, some not asking) gets the host walk's path."""
    rng = random.Random(seed)
    trees = [_tree(rng, rng.randint(0, 12)) for _ in range(4)]
    works = [Work.chunk_tree([7] * rng.randint(1, 3), tree, past=rng.randint(0, 20)) for tree in trees]
    accept = [True, True, True, False]
    pasts = [w.positions[0] for w in works]
    rows, best, starts = _rows(rng, works, pasts, accept, [[0]] * len(works), 64, 1)
    flags = accept_rows(rows, best, sees_rows(rows))
    for i, (w, tree) in enumerate(zip(works, trees)):
        row = flags[starts[i]:starts[i] + len(w)].tolist()
        if not accept[i]:
            assert not any(row)
            continue
        want = greedy_walk(tree, best[starts[i] + w.logits_from:starts[i] + len(w)].tolist()).accepted
        assert accepted_nodes(row, w.positions, w.logits_from) == want


@pytest.mark.parametrize("seed", range(10))
def test_compaction_keeps_the_accepted_rows_of_every_session_in_one_copy(seed):
    rng = random.Random(seed)
    layers, heads, dim, bs = 2, 2, 4, 4
    kv = torch.randn(layers, 2, heads, 25 * bs, dim)  # 24 blocks + scratch (block 24)
    order = random.Random(99).sample(range(24), 24)
    tables = [order[0:8], order[8:16], order[16:24]]  # 32 positions a session, blocks out of order
    trees = [_tree(rng, rng.randint(1, 10)) for _ in range(3)]
    pasts = [rng.randint(0, 20) for _ in trees]
    works = [Work.tree(5, tree, p) for tree, p in zip(trees, pasts)]
    rows, best, starts = _rows(rng, works, pasts, [True] * 3, tables, bs, 24)
    flags = accept_rows(rows, best, sees_rows(rows))
    own = [flags[s:s + len(w)].tolist() for s, w in zip(starts, works)]
    logical = [kv[:, :, :, [b * bs + o for b in t for o in range(bs)]].clone() for t in tables]  # [L, 2, H, 32, D]
    for slot, (w, p) in enumerate(zip(works, pasts)):
        nodes = accepted_nodes(own[slot], w.positions, 0)
        keep_rows_of(logical[slot], p, [0] + [i + 1 for i in nodes])  # the host's way, one session in order
    compact_rows(kv, rows, flags, scratch=24, block_size=bs)
    for slot, (w, p) in enumerate(zip(works, pasts)):
        kept = p + 1 + len(accepted_nodes(own[slot], w.positions, 0))
        got = kv[:, :, :, [b * bs + o for b in tables[slot] for o in range(bs)]]
        assert torch.equal(got[:, :, :, :kept], logical[slot][:, :, :, :kept])
