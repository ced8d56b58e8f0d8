"""Attention straight from the paged pool (``engine.attention``) against SDPA over the same keys gathered in
logical order with the dense tree mask: equal within float32 tolerance, eager and compiled on the CPU, for
trees, chains, decode rows and mixed batches, with block tables out of order, blocks shared between sessions,
a GQA ratio that is not a power of two (Qwen2.5's 6), and batch padding rows. Then the engine on it: greedy
tokens identical to SDPA's and to the generic engine's, and the compiled step token-exact with the eager one."""
from __future__ import annotations

import random
from dataclasses import fields

import pytest
import torch

from edgespec.server.engine.accept import physical
from edgespec.server.engine.attention import pool_attention_forward, pool_block_mask
from edgespec.server.engine.base import Work
from edgespec.server.engine.masks import ancestor_mask, mask_from_ancestors
from edgespec.server.engine.rows import Rows, sees_rows
from edgespec.server.engine.step import Bucket, pack_batch, unpack
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


def setup(rng: random.Random, items: list[tuple[int, Work]], seqs: int, pad_rows: int):
    """A pool of random K/V, block tables out of order (sessions 0 and 1 sharing their first block, as a
    restored prefix does), and the step's rows (``engine.rows.Rows``) for `seqs` table rows (past the items:
    padding sessions) and `pad_rows` padding rows after the items' rows."""
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
    works = [w for _, w in items]
    rows = sum(len(w) for w in works) + pad_rows
    bucket = Bucket(rows, seqs, mb * BS, BS)
    flat = pack_batch([(t, p, w, False) for t, (p, w) in zip(tables, items)], bucket, scratch, [])
    rows = unpack(torch.tensor(flat), bucket)  # views of one packed tensor, as in the step; compiled apart from the
    # step, each field is its own input (views of one base passed as inputs get a synthetic base, which the CPU's
    # FlexAttention kernel does not take as a buffer)
    return kv, Rows(**{f.name: getattr(rows, f.name).clone() for f in fields(Rows)}), scratch


class Heads(torch.nn.Module):
    num_key_value_groups = H_Q // H_KV


def pool_and_sdpa(rng: random.Random, kind: str, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The pool attention over one run of rows (3 padding rows, a padding session), and per session SDPA over its
    own keys gathered in logical order with the dense tree mask, as a batch of one: [N, H_q, D] each."""
    items = batch_of(rng, kind)
    kv, rows, scratch = setup(rng, items, len(items) + 1, 3)
    n = rows.ids.shape[0]
    query = torch.randn(1, H_Q, n, D)
    sees = sees_rows(rows)
    block_pos = torch.zeros(scratch + 1, dtype=torch.long)

    def pool_path(query, keys, values, rows, sees, block_pos):
        mask = pool_block_mask(rows, sees, block_pos, BS, keys.shape[2])
        return pool_attention_forward(Heads(), query, keys, values, mask, scaling=D ** -0.5)[0]

    run = torch.compile(pool_path, fullgraph=True, dynamic=False) if compiled else pool_path
    got = run(query, kv[0][None], kv[1][None], rows, sees, block_pos)[0]  # [N, H_q, D]
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    want = torch.zeros_like(got)
    k = rows.blocks.shape[1] * BS
    for i, (past, w) in enumerate(items):
        start, t = int(rows.start[i]), len(w)
        key_pos = physical(rows.blocks[i:i + 1], torch.arange(k).view(1, k), BS)  # [1, K]
        keys, values = kv[0][:, key_pos].transpose(0, 1), kv[1][:, key_pos].transpose(0, 1)  # [1, H_kv, K, D]
        own = ancestor_mask(torch.tensor([w.parents]), torch.tensor([w.positions]))
        dense = mask_from_ancestors(own, torch.tensor([past]), torch.tensor([t]), k, torch.float32)
        want[start:start + t] = sdpa_attention_forward(Heads(), query[:, :, start:start + t], keys, values, dense,
                                                       scaling=D ** -0.5)[0][0]
    return got, want, items


@pytest.mark.parametrize("kind", ["trees", "chains", "decode", "mixed"])
@pytest.mark.parametrize("seed", range(3))
def test_pool_attention_equals_sdpa_over_gathered_keys(kind, seed):
    got, want, items = pool_and_sdpa(random.Random(seed), kind)
    real = sum(len(w) for _, w in items)  # padding rows' outputs are never read
    torch.testing.assert_close(got[:real], want[:real], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[real:], torch.zeros_like(got[real:]))  # a padding row sees no key


@pytest.mark.slow
def test_compiled_pool_attention_equals_sdpa():
    """The fused kernel Inductor builds on the CPU, on a mixed batch (trees, a chain, decode rows)."""
    import torch._dynamo

    torch._dynamo.reset()
    got, want, items = pool_and_sdpa(random.Random(7), "mixed", compiled=True)
    real = sum(len(w) for _, w in items)
    torch.testing.assert_close(got[:real], want[:real], rtol=1e-5, atol=1e-5)
