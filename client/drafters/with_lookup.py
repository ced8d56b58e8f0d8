"""A model drafter's trees with prompt lookup's continuations merged in (``eagle+ngram``, ``moa-tli1+ngram``...).

Code answers copy long spans of their prompt and of themselves (names, signatures, repeated lines); a small
drafter guesses those a token at a time and often wrongly, while prompt lookup finds them whole for nothing.
Each proposal takes the lookup's continuations first (longest match, most recent first, into a trie of at
most half the loop's node budget), lets the model draft its tree in the rest, and hangs every lookup path
the model did not draft off the model's tree where their prefixes meet. Verification keeps the longest
path the target agrees with, whichever drafter made it, so the merge never lowers what a tree can accept.
The lookup's paths may go deeper than the model's tree (to the tokens the step may still commit): the planner
sizes the model's tree by the model's acceptance, and a copied span should not be cut at that depth. Where
the text copies itself (a match of 3-4 tokens), the proposal is the lookup's tree alone, the copy's path
whole and first, and the model is not asked.

Where the planner finds the model's trees lose and would send plain steps, a long match still pays: the
loop asks ``copy_tree`` for the lookup's tree alone and sends it in place of the plain step when the copies'
own measured acceptance pays for its verification (``TreePlanner.copy_pays``), so a learned drafter on a
slow link or server does not decode a copied line a token at a time.

Everything else (features, offline generation, rollbacks, drafting ahead) is the model drafter's: the
lookup is stateless, and the model drafter's state follows the committed text whichever nodes were
accepted. Under a grammar the lookup adds nothing (its paths would not be masked by the grammar).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from edgespec.shared.session_settings import FeatureRequest
from edgespec.shared.tree import ROOT, DraftTree

from .base import Drafter, DraftRequest, Verification
from .ngram import NgramConfig, continuations, trie_tree

# What the lookup adds to a model's tree: matches of 2-4 tokens (a 1-token match is mostly wrong, and the model
# already drafts the likely next token), the two most recent per length, 8 tokens deep and 8 nodes at most, so
# that a CPU server's verification, which grows with every node, pays little for it.
MERGED_LOOKUP = NgramConfig(max_ngram=4, min_ngram=2, max_continuation=8, max_nodes=8, max_matches=2)
# Where the text copies itself: a match of 3-4 tokens (a 2-token match is too often chance), whose continuation
# goes 12 deep, so that a copied line is verified in one step; 12 nodes at most when it replaces a plain step.
COPY_LOOKUP = NgramConfig(max_ngram=4, min_ngram=3, max_continuation=12, max_nodes=12, max_matches=2)
# The drafting-ahead guess of a lookup node the model did not draft: its parent's and this, per token. Lookup has
# no probabilities; a modest one keeps the loop from guessing a lookup path over the model's likely ones.
LOOKUP_TOKEN_PROB = 0.5


def merge_paths(tree: DraftTree, scores: Sequence[float] | None, sequences: Sequence[Sequence[int]],
                max_nodes: int) -> tuple[DraftTree, list[float] | None]:
    """``tree`` with the paths of ``sequences`` (each from the root) added where it lacks them, in order, until
    it has ``max_nodes`` nodes. The tree's own nodes keep their numbers; new nodes follow them. ``scores`` (per
    node of ``tree``, cumulative log-probabilities) are extended: a new node scores its parent's plus
    log(LOOKUP_TOKEN_PROB), never above it; None stays None."""
    tokens, parents = list(tree.tokens), list(tree.parents)
    out_scores = None if scores is None else list(scores)
    child = {(p, t): i for i, (t, p) in enumerate(zip(tokens, parents))}
    step = math.log(LOOKUP_TOKEN_PROB)
    for seq in sequences:
        parent = ROOT
        for tok in seq:
            node = child.get((parent, int(tok)))
            if node is None:
                if len(tokens) >= max_nodes:
                    break
                node = len(tokens)
                child[(parent, int(tok))] = node
                tokens.append(int(tok))
                parents.append(parent)
                if out_scores is not None:
                    out_scores.append((0.0 if parent == ROOT else out_scores[parent]) + step)
            parent = node
    return DraftTree(tuple(tokens), tuple(parents)), out_scores


class WithLookup(Drafter):
    """``base``'s trees with prompt lookup's continuations merged in (see the module's docstring)."""

    def __init__(self, base: Drafter, lookup: NgramConfig = MERGED_LOOKUP, copy: NgramConfig = COPY_LOOKUP):
        self.base = base
        self.lookup, self.copy = lookup, copy
        self.name = f"{base.name}+ngram"
        self.can_generate_offline = base.can_generate_offline
        self.stops_by_path = base.stops_by_path
        self._scores: list[float] | None = None
        self.lookup_nodes = 0  # lookup nodes the last tree gained beyond the model's (for benchmarks)

    def feature_request(self) -> FeatureRequest:
        return self.base.feature_request()

    def start(self, prompt_ids: Sequence[int], first_token: int, features: Mapping[str, torch.Tensor]) -> None:
        self.base.start(prompt_ids, first_token, features)

    def _paths(self, committed: Sequence[int], depth: int) -> tuple[bool, list[list[int]]]:
        """Whether the text copies itself (a match of 3-4 tokens, COPY_LOOKUP), and the lookup's paths: that
        copy's first, then the shorter matches' (MERGED_LOOKUP), each at most `depth` tokens."""
        copy = continuations(committed, self.copy, min(self.copy.max_continuation, depth))[:1]
        return bool(copy), copy + continuations(committed, self.lookup, min(self.lookup.max_continuation, depth))

    def propose(self, request: DraftRequest) -> DraftTree:
        # the lookup's paths cost no drafting: they may go past the planner's depth, which the model's
        # acceptance sets, to the tokens the step may still commit (request.free_depth)
        depth = max(request.max_depth, request.free_depth)
        copying, found = (False, []) if request.constraint is not None or request.max_depth < 1 else self._paths(
            request.committed, depth)
        if copying:
            # The lookup's tree alone, in all the step's nodes, and the model is not asked: beside a copy its
            # nodes took no token more on HumanEval and Spec-Bench's MT-Bench prompts, and cost a drafting pass
            # a level (server/training/README.md, "Prompt lookup merged in").
            merged, self._scores = merge_paths(DraftTree((), ()), [], found, request.max_nodes)
            self.lookup_nodes = len(merged)
            return merged
        # the lookup's trie first, so the model knows how many nodes are left to it
        reserve = len(trie_tree(found, min(self.lookup.max_nodes, request.max_nodes // 2))) if found else 0
        tree = self.base.propose(replace(request, max_nodes=request.max_nodes - reserve) if reserve else request)
        scores = self.base.tree_scores()
        if not found:
            self._scores, self.lookup_nodes = (None if scores is None else list(scores)), 0
            return tree
        merged, self._scores = merge_paths(tree, scores, found, min(request.max_nodes, len(tree) + reserve))
        self.lookup_nodes = len(merged) - len(tree)
        return merged

    def copy_tree(self, committed: Sequence[int], max_nodes: int, max_depth: int) -> DraftTree:
        """The lookup's tree alone where the text copies itself (the tree ``propose`` returns then, in at most
        COPY_LOOKUP.max_nodes), for a step the loop would make plain: one verification takes a copied span in
        place of a decode step per token. Empty where the text does not copy."""
        copying, found = self._paths(committed, max_depth) if max_depth > 0 else (False, [])
        return trie_tree(found, min(self.copy.max_nodes, max_nodes)) if copying else DraftTree((), ())

    def tree_scores(self) -> list[float] | None:
        return None if self._scores is None else list(self._scores)

    def observe(self, verification: Verification) -> None:
        self.base.observe(verification)

    def resync(self, committed: Sequence[int], kept: int, features: Mapping[str, torch.Tensor]) -> None:
        self.base.resync(committed, kept, features)

    def rewind(self, committed: Sequence[int]) -> None:
        self.base.rewind(committed)

    def generate_offline(self, committed: Sequence[int]) -> int:
        return self.base.generate_offline(committed)

    def close(self) -> None:
        self.base.close()
