"""Drafters and the EAGLE-2 tree builder on their own (no server)."""
from __future__ import annotations

import math

import pytest
import torch

from edgespec.client.drafters.base import DraftRequest, OfflineUnsupportedError, common_prefix
from edgespec.client.drafters.independent import IndependentConfig, IndependentDrafter
from edgespec.client.drafters.ngram import NgramConfig, NgramDrafter, continuations, match_starts, trie_tree
from edgespec.client.drafters.tree_builder import Candidates, TreeShape, build_tree, select_tree
from edgespec.shared.kv import with_cache
from edgespec.shared.tree import MAX_NODES, ROOT, DraftTree


# ---------------------------------------------------------------- tree builder
def _table_expand(table: torch.Tensor):
    """expand() for a fake 'model' whose next-token log-probs depend only on the last token."""
    calls = []

    def expand(frontier, cands: Candidates):
        calls.append(list(frontier))
        return table[[cands.tokens[i] for i in frontier]]

    return expand, calls


def _random_table(vocab=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(vocab, vocab, generator=g) * 3, dim=-1)


def test_branch_one_is_the_greedy_chain():
    table = _random_table()
    expand, calls = _table_expand(table)
    tree, _ = build_tree(table[0], expand, TreeShape(branch=1, depth=5, max_nodes=5, min_prob=0.0))
    chain, tok = [], 0
    for _ in range(5):
        tok = int(table[tok].argmax())
        chain.append(tok)
    assert tree == DraftTree.chain(chain)
    assert len(calls) == 4  # depth 1 comes from the root's distribution


def test_tree_keeps_the_best_nodes_and_is_valid():
    table = _random_table(seed=3)
    expand, calls = _table_expand(table)
    shape = TreeShape(branch=3, depth=4, max_nodes=10, min_prob=0.0)
    tree, cands = build_tree(table[0], expand, shape)
    tree.validate()
    assert len(tree) == 10
    assert all(len(f) <= 3 for f in calls) and len(calls) == 3
    # the kept nodes are the 10 best scores among all candidates
    best = sorted(cands.scores, reverse=True)[:10]
    kept_scores = []
    for i in range(len(tree)):
        path = [tree.tokens[j] for j in tree.ancestors(i)]
        prev, s = 0, 0.0
        for t in path:
            s += float(table[prev, t])
            prev = t
        kept_scores.append(s)
    assert sorted(kept_scores, reverse=True) == pytest.approx(best, rel=1e-5)


def test_limits_from_the_request_win():
    table = _random_table()
    expand, _ = _table_expand(table)
    tree, _ = build_tree(table[0], expand, TreeShape(branch=4, depth=6, max_nodes=30, min_prob=0.0),
                         max_nodes=7, max_depth=2)
    assert len(tree) == 7 and max(tree.depths()) <= 2
    empty, _ = build_tree(table[0], expand, TreeShape(), max_depth=0)
    assert len(empty) == 0


def test_min_prob_stops_deepening():
    flat = torch.full((12, 12), -math.log(12.0))  # every path's probability falls as 12^-depth
    expand, calls = _table_expand(flat)
    tree, _ = build_tree(flat[0], expand, TreeShape(branch=2, depth=6, max_nodes=20, min_prob=0.05))
    assert max(tree.depths()) == 2 and len(calls) == 1


def test_frontier_paths_below_min_prob_are_not_fed_unless_asked():
    # token 1 is likely (0.9) after anything, token 2 rare (0.09): the rare path is never worth a pass
    table = torch.full((12, 12), 0.001)
    table[:, 1], table[:, 2] = 0.9, 0.09
    table = torch.log(table / table.sum(-1, keepdim=True))
    expand, calls = _table_expand(table)
    build_tree(table[0], expand, TreeShape(branch=2, depth=4, max_nodes=8, min_prob=0.2))
    assert [len(f) for f in calls] == [1, 1, 1]  # only the 0.9^d chain
    expand, calls = _table_expand(table)
    build_tree(table[0], expand, TreeShape(branch=2, depth=4, max_nodes=8, min_prob=0.2, prune_frontier=False))
    assert [len(f) for f in calls] == [2, 2, 2]


def test_path_floors_replace_min_prob_depth_by_depth():
    """The chain 0.9^d: floors of 0 at depth 1 (both paths fed) and 0.5 beyond stop it once its path falls below
    0.5 (0.9^6 = 0.53 is drafted on, 0.9^7 = 0.48 is not); the shape's own min_prob (0.95) would have stopped it
    at depth 1. Drafted ahead, the floors count depths below the guessed bonus level."""
    table = torch.full((12, 12), 0.001)
    table[:, 1], table[:, 2] = 0.9, 0.09
    table = torch.log(table / table.sum(-1, keepdim=True))
    shape = TreeShape(branch=2, depth=12, max_nodes=16, min_prob=0.95)
    expand, calls = _table_expand(table)
    tree, _ = build_tree(table[0], expand, shape)
    assert max(tree.depths()) == 1 and not calls
    expand, calls = _table_expand(table)
    tree, _ = build_tree(table[0], expand, shape, floors=(0.0, 0.5))
    assert max(tree.depths()) == 7 and [len(f) for f in calls] == [2, 1, 1, 1, 1, 1]
    expand, calls = _table_expand(table)
    tree, _ = build_tree(table[0], expand, shape, floors=(0.0, 0.5), ahead=True)
    assert max(tree.depths()) == 8 and len(calls) == 7


def test_candidates_keep_draft_tree_numbering():
    # candidate indices are DraftTree node indices (255 = ROOT): a wide, deep tree stops before a 256th
    table = _random_table(seed=1)
    expand, _ = _table_expand(table)
    tree, cands = build_tree(table[0], expand, TreeShape(branch=4, depth=30, max_nodes=200, min_prob=0.0))
    assert len(cands.tokens) <= MAX_NODES and len(tree) == 200
    cands.tree().validate()
    tree.validate()


def test_select_tree_refuses_non_monotone_scores():
    c = Candidates()
    c.add(5, ROOT, -3.0, 1)
    c.add(6, 0, -1.0, 2)  # a child scoring above its parent: not log-probabilities
    with pytest.raises(ValueError, match="parent"):
        select_tree(c, 1)


# --------------------------------------------------------------------- ngram
def test_match_starts_most_recent_first():
    import numpy as np

    ctx = np.array([1, 2, 3, 1, 2, 4, 1, 2])
    assert match_starts(ctx, 2) == [3, 0]
    assert match_starts(ctx, 3) == []


def test_ngram_tree_holds_distinct_continuations():
    ctx = [1, 2, 3, 9, 1, 2, 4, 4, 1, 2]
    drafter = NgramDrafter(NgramConfig(max_ngram=2, min_ngram=2, max_continuation=3, max_nodes=16))
    tree = drafter.propose(DraftRequest(ctx, 255, 10))
    paths = {tuple(tree.tokens[i] for i in p) for p in tree.paths()}
    assert paths == {(4, 4, 1), (3, 9, 1)}  # two branches under the root, most recent first
    assert tree.parents[0] == ROOT and tree.tokens[0] == 4


def test_trie_merges_shared_prefixes_and_respects_budget():
    tree = trie_tree([[5, 6, 7], [5, 6, 8], [9]], max_nodes=10)
    assert tree.tokens == (5, 6, 7, 8, 9) and tree.parents == (ROOT, 0, 1, 1, ROOT)
    assert len(trie_tree([[1, 2, 3, 4], [5, 6]], max_nodes=3)) == 3


def test_ngram_no_match_gives_empty_tree_and_no_offline():
    drafter = NgramDrafter()
    assert len(drafter.propose(DraftRequest([1, 2, 3], 255, 10))) == 0
    with pytest.raises(OfflineUnsupportedError, match="cannot generate without the server"):
        drafter.generate_offline([1, 2, 3])


def test_continuations_cap_depth():
    assert all(len(c) <= 2 for c in continuations([7, 8, 7, 8, 7, 8], NgramConfig(), 2))


def test_bad_ngram_config_is_refused():
    with pytest.raises(ValueError, match="min_ngram"):
        NgramConfig(max_ngram=1, min_ngram=3)


# --------------------------------------------------------------- independent
@pytest.fixture(scope="module")
def small_lm(tiny_drafter_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.float32).eval()


@torch.inference_mode()
def _logprobs(model, ids):
    return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)


def test_independent_tree_scores_match_full_recompute(small_lm):
    """Tree nodes fed with the tree mask see exactly their ancestors: same log-probs as a plain forward."""
    drafter = IndependentDrafter(small_lm, IndependentConfig(TreeShape(branch=3, depth=4, max_nodes=30, min_prob=0.0)))
    ctx = list(range(40, 70))
    tree = drafter.propose(DraftRequest(ctx, 255, 10))
    assert len(tree) == 30
    for i in range(len(tree)):
        path = [tree.tokens[j] for j in tree.ancestors(i)]
        want = sum(float(_logprobs(small_lm, ctx + path[:d])[path[d]]) for d in range(len(path)))
        top = _logprobs(small_lm, ctx + path[:-1]).topk(3).indices.tolist()
        assert path[-1] in top
        assert want == pytest.approx(_path_score(drafter, ctx, path), abs=1e-3)


def _path_score(drafter, ctx, path):
    with torch.inference_mode():
        lp = torch.log_softmax(drafter.model(input_ids=torch.tensor([ctx + path])).logits[0].float(), -1)
    return sum(float(lp[len(ctx) - 1 + d, path[d]]) for d in range(len(path)))


def test_independent_cache_follows_rollbacks(small_lm):
    drafter = IndependentDrafter(small_lm, IndependentConfig(TreeShape(min_prob=0.0)))
    ctx = list(range(40, 60))
    a = drafter.generate_offline(ctx)
    assert a == int(_logprobs(small_lm, ctx).argmax())
    b = drafter.generate_offline(ctx + [a])
    assert b == int(_logprobs(small_lm, ctx + [a]).argmax())
    # the committed text is cut back and changed: the cache must not leak the old tokens
    other = ctx[:10] + [7, 7, 7]
    assert drafter.generate_offline(other) == int(_logprobs(small_lm, other).argmax())
    assert drafter._cache.get_seq_length() == len(other)
    tree = drafter.propose(DraftRequest(other, 255, 4))
    assert drafter._cache.get_seq_length() > len(other)  # the tree's KV waits behind the committed tokens
    assert tree.tokens[0] == int(_logprobs(small_lm, other).argmax())
    # a rollback after a tree drops the tree's KV with the rest
    assert drafter.generate_offline(other[:5]) == int(_logprobs(small_lm, other[:5]).argmax())
    assert drafter._cache.get_seq_length() == 5


def _fresh_cache(model, ids):
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), use_cache=True, **with_cache(model, cache))
    return cache


@pytest.mark.parametrize("accept", [0, 1, 3])
def test_accepted_tree_nodes_keep_their_kv_and_are_not_fed_again(small_lm, accept):
    drafter = IndependentDrafter(small_lm, IndependentConfig(TreeShape(branch=2, depth=4, max_nodes=8, min_prob=0.0)))
    ctx = list(range(40, 70))
    drafter.propose(DraftRequest(ctx, 255, 8))
    cands, _ = drafter._tree
    deepest = max(range(len(cands.tokens)), key=lambda c: cands.depths[c])  # its ancestors were all fed
    path = [cands.tokens[c] for c in cands.ancestors(deepest)][:accept]
    assert len(path) == accept
    bonus = 5
    fed = []
    real_hidden = drafter._hidden
    drafter._hidden = lambda ids, pos, mask: (fed.append(list(ids)), real_hidden(ids, pos, mask))[1]
    committed = ctx + path + [bonus]
    nxt = drafter.propose(DraftRequest(committed, 255, 8))
    assert fed[0] == [bonus]  # only the bonus token: the accepted nodes' KV was moved into place
    drafter._hidden = real_hidden
    assert nxt.tokens[0] == int(_logprobs(small_lm, committed).argmax())
    # the cache's committed part equals a fresh forward over the committed text
    want = _fresh_cache(small_lm, committed)
    for got_layer, want_layer in zip(drafter._cache.layers, want.layers):
        n = len(committed)
        assert torch.allclose(got_layer.keys[..., :n, :], want_layer.keys, atol=1e-4)
        assert torch.allclose(got_layer.values[..., :n, :], want_layer.values, atol=1e-4)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_unknown_drafter_names_the_choices():
    from edgespec.client.drafters.factory import DrafterOptions, UnknownDrafterError, make_drafter

    with pytest.raises(UnknownDrafterError, match="ngram, independent"):
        make_drafter(DrafterOptions(name="medusa"))
    assert make_drafter(DrafterOptions(name="ngram")).name == "ngram"


def test_stop_ends_the_growing_with_the_best_of_what_is_there():
    """build_tree asks `stop` before each pass, with every candidate so far in target ids; True keeps the best
    of the candidates there (drafting ahead: the verdict came and ruled the tree out)."""
    table = _random_table(seed=5)
    shape = TreeShape(branch=2, depth=6, max_nodes=8, min_prob=0.0)
    expand, calls = _table_expand(table)
    seen = []

    def stop(candidates: DraftTree) -> bool:
        seen.append(candidates)
        return len(seen) == 3  # before the third pass

    tree, cands = build_tree(table[0], expand, shape, to_target=list(range(100, 112)), stop=stop)
    assert len(calls) == 2 and len(seen) == 3
    assert seen[0].tokens == tuple(100 + t for t in cands.tokens[:2]) and len(seen[2]) == 2 + 2 * 4
    assert max(tree.depths()) == 3 and len(tree) == 8
    never, _ = build_tree(table[0], _table_expand(table)[0], shape, stop=lambda c: False)
    assert never == build_tree(table[0], _table_expand(table)[0], shape)[0]
