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
    layers, heads, slot_tokens, dim = 2, 2, 48, 4
    kv = torch.randn(layers, 2, 4, heads, slot_tokens, dim)  # 3 slots + scratch
    trees = [_tree(rng, rng.randint(1, 10)) for _ in range(3)]
    pasts = [rng.randint(0, 20) for _ in trees]
    works = [Work.tree(5, tree, p) for tree, p in zip(trees, pasts)]
    t = max(len(w) for w in works)
    ids, positions, parents, best, lf, n, acc = _batch(rng, works, t, [True] * 3)
    flags = greedy_accept(ids, parents, best, lf, n, acc, ancestor_mask(parents, positions))
    expected = kv.clone()
    for slot, (w, p) in enumerate(zip(works, pasts)):
        nodes = accepted_nodes(flags[slot].tolist(), w.positions, 0)
        keep_rows_of(expected[:, :, slot], p, [0] + [i + 1 for i in nodes])  # the host's way, one session
    compact_kv(kv, torch.tensor([0, 1, 2]), torch.tensor(pasts), lf, positions, flags, scratch=3)
    for slot, (w, p) in enumerate(zip(works, pasts)):
        kept = p + 1 + len(accepted_nodes(flags[slot].tolist(), w.positions, 0))
        assert torch.equal(kv[:, :, slot, :, :kept], expected[:, :, slot, :, :kept])
