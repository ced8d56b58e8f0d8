"""Prompt lookup over the whole context, as a tree of the distinct continuations found.

The last n tokens (n from ``max_ngram`` down to ``min_ngram``) are searched for
earlier in the context; what followed each match is a candidate continuation.
Continuations are merged into a trie, longest n and most recent match first, so
shared prefixes become one path and different continuations become branches.
No model: it cannot generate alone, so it has no offline mode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edgespec.shared.tree import ROOT, DraftTree

from .base import Drafter, DraftRequest


@dataclass(frozen=True)
class NgramConfig:
    """Prompt lookup settings."""

    max_ngram: int = 4  # longest suffix matched
    min_ngram: int = 1  # shortest suffix matched (1 finds much, most of it wrong; the trie's budget limits it)
    max_continuation: int = 10  # tokens taken after one match (deepest path)
    max_nodes: int = 24  # nodes in the tree
    max_matches: int = 6  # most recent matches used per n

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.max_continuation < 1 or self.max_nodes < 1 or self.max_matches < 1:
            raise ValueError(f"max_continuation, max_nodes and max_matches must be >= 1, got {self}")


def match_starts(context: np.ndarray, n: int) -> list[int]:
    """Start indices i (most recent first) where context[i:i+n] equals the last n tokens, i + n < len."""
    if len(context) <= n:
        return []
    windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # [len - n, n]: excludes the suffix itself
    hits = np.flatnonzero((windows == context[-n:]).all(axis=1))
    return hits[::-1].tolist()


def continuations(context: Sequence[int], config: NgramConfig, max_len: int) -> list[list[int]]:
    """Continuations after matches of the context's suffix, longest n and most recent first."""
    ctx = np.asarray(context, dtype=np.int64)
    out: list[list[int]] = []
    for n in range(config.max_ngram, config.min_ngram - 1, -1):
        for start in match_starts(ctx, n)[: config.max_matches]:
            follow = ctx[start + n: start + n + max_len].tolist()
            if follow:
                out.append(follow)
    return out


def trie_tree(sequences: list[list[int]], max_nodes: int) -> DraftTree:
    """Merge sequences into a prefix tree of at most max_nodes nodes (earlier sequences win the budget)."""
    return counted_trie(sequences, max_nodes)[0]


def counted_trie(sequences: list[list[int]], max_nodes: int) -> tuple[DraftTree, list[int]]:
    """``trie_tree`` and, per node, how many of the sequences merged pass through it."""
    counts: list[int] = []
    child: dict[tuple[int, int], int] = {}  # (parent, token) -> node, in node order
    for seq in sequences:
        parent = ROOT
        for tok in seq:
            node = child.get((parent, tok))
            if node is None:
                if len(counts) >= max_nodes:
                    break
                node = len(counts)
                child[(parent, tok)] = node
                counts.append(0)
            counts[node] += 1
            parent = node
        if len(counts) >= max_nodes:
            break
    return DraftTree(tuple(tok for _, tok in child), tuple(parent for parent, _ in child)), counts


class NgramDrafter(Drafter):
    name = "ngram"
    can_generate_offline = False

    def __init__(self, config: NgramConfig = NgramConfig()):
        self.config = config
        self._scores: list[float] = []  # per node of the last tree: log of the share of matches through it

    def propose(self, request: DraftRequest) -> DraftTree:
        # no depth left: no continuation, so an empty tree and no scores
        found = continuations(request.committed, self.config, min(self.config.max_continuation, request.max_depth))
        tree, counts = counted_trie(found, min(self.config.max_nodes, request.max_nodes))
        self._scores = [math.log(c / len(found)) for c in counts]
        return tree

    def tree_scores(self) -> list[float]:
        """No model, so its guess is its match counts: the share of the matches found whose continuation runs
        through a node stands for the chance the target accepts the path to it (the path most matches follow
        to its end is the guess). Stateless, so drafting ahead needs no rewinding."""
        return list(self._scores)
