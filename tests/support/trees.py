"""Random draft trees along a known continuation, for the token-exact verification tests."""
from __future__ import annotations

import random

from edgespec.shared.tree import ROOT, DraftTree


def tree_along(rng: random.Random, truth: list[int], vocab: int = 259, max_depth: int = 6) -> DraftTree:
    """A tree whose main path follows `truth` for a random number of steps (up to `max_depth`), with random
    siblings and twigs (greedy verification then accepts some of it)."""
    tokens: list[int] = []
    parents: list[int] = []
    parent = ROOT
    for depth in range(rng.randint(0, min(len(truth), max_depth))):
        for _ in range(rng.randint(0, 2)):
            tokens.append(rng.randrange(vocab))
            parents.append(parent)
        tokens.append(truth[depth])
        parents.append(parent)
        parent = len(tokens) - 1
    for _ in range(rng.randint(0, 3)):
        tokens.append(rng.randrange(vocab))
        parents.append(rng.choice([ROOT] + list(range(len(tokens) - 1))))
    return DraftTree(tuple(tokens), tuple(parents)).validate()
