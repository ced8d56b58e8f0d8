"""Greedy acceptance and KV compaction on the device equal the host's reference (shared.verification, shared.kv)."""
from __future__ import annotations

import random

import pytest
import torch

from edgespec.server.device_accept import accepted_nodes, compact_kv, greedy_accept
from edgespec.server.engine import Work
from edgespec.server.engine_masks import ancestor_mask
from edgespec.shared.kv import keep_rows_of
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.verification import greedy_walk


def _tree(rng: random.Random, n: int) -> DraftTree:
    """Random tree over a tiny vocabulary, so siblings often share a token (the first one must win)."""
    parents = tuple(rng.choice([ROOT] + list(range(i))) for i in range(n))
    return DraftTree(tuple(rng.randrange(3) for _ in range(n)), parents)


def _batch(rng: random.Random, works: list[Work], t: int, accept: list[bool]):
    pad = lambda v, fill: list(v) + [fill] * (t - len(v))  # noqa: E731
    ids = torch.tensor([pad(w.ids, 0) for w in works])
    positions = torch.tensor([pad(w.positions, 0) for w in works])
    parents = torch.tensor([pad(w.parents, -1) for w in works])
    best = torch.tensor([[rng.randrange(3) if r >= w.logits_from else -1 for r in range(len(w))]
                         + [-1] * (t - len(w)) for w in works])
    lf = torch.tensor([w.logits_from for w in works])
    n = torch.tensor([len(w) for w in works])
    return ids, positions, parents, best, lf, n, torch.tensor(accept)


@pytest.mark.parametrize("seed", range(30))
def test_device_acceptance_equals_the_greedy_walk(seed):
    """Every session of a batch (trees after a causal chunk or alone, some not asking) gets the host walk's path."""
    rng = random.Random(seed)
    trees = [_tree(rng, rng.randint(0, 12)) for _ in range(4)]
    works = [Work.chunk_tree([7] * rng.randint(1, 3), tree, past=rng.randint(0, 20)) for tree in trees]
    accept = [True, True, True, False]
    t = max(len(w) for w in works)
    ids, positions, parents, best, lf, n, acc = _batch(rng, works, t, accept)
    flags = greedy_accept(ids, parents, best, lf, n, acc, ancestor_mask(parents, positions))
    for i, (w, tree) in enumerate(zip(works, trees)):
        row = flags[i].tolist()
        if not accept[i]:
            assert not any(row)
            continue
        want = greedy_walk(tree, best[i, w.logits_from:len(w)].tolist()).accepted
        assert accepted_nodes(row, w.positions, w.logits_from) == want


@pytest.mark.parametrize("seed", range(10))
def test_compaction_keeps_the_accepted_rows_of_every_session_in_one_copy(seed):
    rng = random.Random(seed)
    layers, heads, dim, bs = 2, 2, 4, 4
    kv = torch.randn(layers, 2, heads, 25 * bs, dim)  # 24 blocks + scratch (block 24)
    order = random.Random(99).sample(range(24), 24)
    tables = [order[0:8], order[8:16], order[16:24]]  # 32 positions a session, blocks out of order
    slots = torch.tensor(tables)
    trees = [_tree(rng, rng.randint(1, 10)) for _ in range(3)]
    pasts = [rng.randint(0, 20) for _ in trees]
    works = [Work.tree(5, tree, p) for tree, p in zip(trees, pasts)]
    t = max(len(w) for w in works)
    ids, positions, parents, best, lf, n, acc = _batch(rng, works, t, [True] * 3)
    flags = greedy_accept(ids, parents, best, lf, n, acc, ancestor_mask(parents, positions))
    logical = [kv[:, :, :, [b * bs + o for b in t for o in range(bs)]].clone() for t in tables]  # [L, 2, H, 32, D]
    for slot, (w, p) in enumerate(zip(works, pasts)):
        nodes = accepted_nodes(flags[slot].tolist(), w.positions, 0)
        keep_rows_of(logical[slot], p, [0] + [i + 1 for i in nodes])  # the host's way, one session in order
    compact_kv(kv, slots, torch.tensor(pasts), lf, positions, flags, scratch=24, block_size=bs)
    for slot, (w, p) in enumerate(zip(works, pasts)):
        kept = p + 1 + len(accepted_nodes(flags[slot].tolist(), w.positions, 0))
        got = kv[:, :, :, [b * bs + o for b in tables[slot] for o in range(bs)]]
        assert torch.equal(got[:, :, :, :kept], logical[slot][:, :, :, :kept])
