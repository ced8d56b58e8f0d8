"""NAME+ngram: prompt lookup's continuations merged into a model drafter's trees (client/drafters/with_lookup.py).
The merge is a pure function checked node by node; the drafter keeps within the loop's node budget, adds nothing
under a grammar, and through a real server its output is the target's greedy output token for token."""
from __future__ import annotations

import math
import random

import pytest

from edgespec.client.drafters.base import DraftRequest
from edgespec.client.drafters.factory import DrafterOptions, UnknownDrafterError, make_drafter
from edgespec.client.drafters.ngram import continuations, trie_tree
from edgespec.client.drafters.with_lookup import COPY_LOOKUP, LOOKUP_TOKEN_PROB, MERGED_LOOKUP, WithLookup, merge_paths
from edgespec.client.loop.generation import GenerationConfig
from edgespec.shared.tree import ROOT, DraftTree

STEP = math.log(LOOKUP_TOKEN_PROB)
# a prompt that repeats itself: the lookup finds 2-4 token matches at once
REPEATS = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add("


def test_lookup_paths_hang_where_their_prefixes_meet_the_models_tree():
    tree = DraftTree((5, 6, 9), (ROOT, 0, ROOT))
    merged, scores = merge_paths(tree, [-0.1, -0.3, -2.0], [[5, 6, 7], [8, 9], [9]], max_nodes=10)
    assert merged.tokens == (5, 6, 9, 7, 8, 9)
    assert merged.parents == (ROOT, 0, ROOT, 1, ROOT, 4)
    assert scores == pytest.approx([-0.1, -0.3, -2.0, -0.3 + STEP, STEP, 2 * STEP])


def test_the_budget_cuts_lookup_paths_and_never_the_models_nodes():
    tree = DraftTree((5, 6), (ROOT, 0))
    merged, scores = merge_paths(tree, None, [[7, 8, 9], [5, 4]], max_nodes=4)
    assert merged.tokens == (5, 6, 7, 8) and merged.parents == (ROOT, 0, ROOT, 2)
    assert scores is None
    full, _ = merge_paths(tree, None, [[1, 2]], max_nodes=1)  # a budget below the model's tree adds nothing
    assert full == tree


def test_merged_trees_are_valid_tries_whose_scores_never_rise_down_a_path():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randrange(0, 8)
        parents = [ROOT if i == 0 or rng.random() < 0.3 else rng.randrange(i) for i in range(n)]
        tokens = [rng.randrange(4) for _ in range(n)]
        seen = set()
        for i in range(n):  # a drafter's tree has no two equal siblings
            while (parents[i], tokens[i]) in seen:
                tokens[i] += 1
            seen.add((parents[i], tokens[i]))
        scores = []
        for p in parents:
            scores.append((0.0 if p == ROOT else scores[p]) - rng.random())
        seqs = [[rng.randrange(5) for _ in range(rng.randrange(1, 6))] for _ in range(rng.randrange(4))]
        budget = rng.randrange(n, n + 10)
        merged, got = merge_paths(DraftTree(tokens, parents), scores, seqs, budget)
        merged.validate()
        assert len(merged) <= budget and merged.tokens[:n] == tuple(tokens) and got[:n] == scores
        pairs = list(zip(merged.parents, merged.tokens))
        assert len(pairs) == len(set(pairs))
        for i, p in enumerate(merged.parents):
            assert got[i] <= (0.0 if p == ROOT else got[p])
        for seq in seqs:  # every lookup path is in the tree as far as the budget allowed, and whole when it fits
            node, depth = ROOT, 0
            for tok in seq:
                nxt = next((i for i, pt in enumerate(pairs) if pt == (node, tok)), None)
                if nxt is None:
                    break
                node, depth = nxt, depth + 1
            assert depth == len(seq) or len(merged) == budget


@pytest.fixture
def drafter(tiny_drafter_dir, tiny_model_dir):
    d = make_drafter(DrafterOptions("independent+ngram", model=str(tiny_drafter_dir), dtype="float32"))
    yield d
    d.close()


def test_the_factory_builds_name_plus_ngram_and_refuses_ngram_plus_ngram(drafter):
    assert isinstance(drafter, WithLookup) and drafter.name == "independent+ngram"
    assert drafter.lookup == MERGED_LOOKUP and drafter.stops_by_path == drafter.base.stops_by_path
    with pytest.raises(UnknownDrafterError, match="ngram\\+ngram is ngram"):
        make_drafter(DrafterOptions("ngram+ngram"))
    with pytest.raises(UnknownDrafterError, match="NAME\\+ngram"):
        make_drafter(DrafterOptions("medusa+ngram"))


def test_a_tree_keeps_to_the_loops_node_budget_and_holds_the_lookup_paths(drafter, tiny_tokenizer):
    ids = tiny_tokenizer(REPEATS)["input_ids"]
    found = continuations(ids, MERGED_LOOKUP, MERGED_LOOKUP.max_continuation)
    assert found, "the prompt repeats itself: the lookup must find a match"
    for budget in (2, 6, 16):
        tree = drafter.propose(DraftRequest(ids, max_nodes=budget, max_depth=12))
        tree.validate(max_nodes=budget)
        assert drafter.lookup_nodes > 0
        scores = drafter.tree_scores()
        assert len(scores) == len(tree)
        first = found[0][: min(len(found[0]), budget // 2)]  # the lookup's first path fits in half the budget
        node = ROOT
        for tok in first:
            node = next(i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens)) if (p, t) == (node, tok))


def test_under_a_grammar_the_lookup_adds_nothing(drafter, tiny_tokenizer):
    import torch

    class AnyToken:  # a grammar that allows every token: only its presence matters here
        def path_masks(self, paths):
            return torch.ones(len(paths), len(tiny_tokenizer), dtype=torch.bool)

    ids = tiny_tokenizer(REPEATS)["input_ids"]
    drafter.propose(DraftRequest(ids, max_nodes=16, max_depth=12, constraint=AnyToken()))
    assert drafter.lookup_nodes == 0


def test_through_a_server_the_output_is_the_targets_greedy_output(tiny_server, make_client, tiny_target_f32, greedy):
    client = make_client(tiny_server.address, "independent+ngram")
    assert client.drafter.name == "independent+ngram"
    ids = client.encode(REPEATS)
    result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
    assert result.token_ids == greedy(tiny_target_f32, ids, 48, set())
    assert result.metrics.num_verifications > 0


def lookup_paths(ids, depth):
    """What a WithLookup merges where the text copies itself: the copy's path, then the shorter matches'."""
    return (continuations(ids, COPY_LOOKUP, min(depth, COPY_LOOKUP.max_continuation))[:1]
            + continuations(ids, MERGED_LOOKUP, min(depth, MERGED_LOOKUP.max_continuation)))


def test_a_copy_is_the_lookups_tree_alone_from_matches_of_three_tokens_or_more(drafter, tiny_tokenizer):
    ids = tiny_tokenizer(REPEATS)["input_ids"]
    want = trie_tree(lookup_paths(ids, 16), COPY_LOOKUP.max_nodes)
    assert len(want) and drafter.copy == COPY_LOOKUP
    assert drafter.copy_tree(ids, 64, 16) == want and max(want.depths()) == COPY_LOOKUP.max_continuation
    shallow = drafter.copy_tree(ids, 64, 2)
    assert len(shallow) and max(shallow.depths()) == 2
    assert len(drafter.copy_tree(ids, 3, 16)) == 3 and not len(drafter.copy_tree(ids, 64, 0))
    # a text whose only repeats are two tokens long: a merged tree would take them, a copy does not
    assert not len(drafter.copy_tree([1, 2, 9, 8, 7, 1, 2], 64, 16))
    assert continuations([1, 2, 9, 8, 7, 1, 2], MERGED_LOOKUP, 8)


def test_where_the_text_copies_the_proposal_is_the_lookups_tree_alone(drafter, tiny_tokenizer):
    """A 3-4 token match: the copy's path whole and first, then the shorter matches', in all the step's nodes,
    scored by the lookup; the model is not asked (its drafting would be a pass a level for no token more)."""
    ids = tiny_tokenizer(REPEATS)["input_ids"]
    paths = lookup_paths(ids, 12)
    assert len(paths[0]) == 12 > 16 // 2
    tree = drafter.propose(DraftRequest(ids, max_nodes=16, max_depth=3, free_depth=12))
    assert tree == trie_tree(paths, 16) and drafter.lookup_nodes == len(tree)
    assert [p for p in tree.paths() if len(p) == 12]  # the copy whole, past the planner's depth of 3
    assert drafter.tree_scores() == pytest.approx([d * STEP for d in tree.depths()])
    plain = drafter.propose(DraftRequest(ids[:3], max_nodes=16, max_depth=3))  # no match at all: the model's tree
    assert len(plain) and drafter.lookup_nodes == 0


def test_lookup_paths_go_past_the_planners_depth_to_the_free_depth(drafter):
    """The planner's depth comes from the model's acceptance; the lookup's paths cost no drafting and go as deep
    as the step may commit (DraftRequest.free_depth). Here the text's matches are of 2 tokens, no copy."""
    ids = [10, 11, 20, 21, 22, 23, 24, 25, 26, 27, 10, 11]
    assert not len(drafter.copy_tree(ids, 64, 16)) and continuations(ids, MERGED_LOOKUP, 8)
    capped = drafter.propose(DraftRequest(ids, max_nodes=16, max_depth=1))
    assert max(capped.depths()) == 1
    free = drafter.propose(DraftRequest(ids, max_nodes=16, max_depth=1, free_depth=6))
    assert max(free.depths()) > 1 and drafter.lookup_nodes > 0
