"""Bookkeeping of drafted nodes on top of a drafter's committed cache.

A drafter's cache has committed rows (a chain) followed by draft rows (a tree).
Draft nodes are numbered 0, 1, ... in the order ``expand`` added them since the
last ``clear``; parent -1 is the root (the last committed token).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .masks import tree_visibility


class DraftArea:
    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.parents: list[int] = []  # per node: parent node, -1 = root
        self.depths: list[int] = []  # per node: 1 for children of the root
        self.vis: torch.Tensor | None = None  # [k, n_fixed + k] over the cache at the time of adding

    def __len__(self) -> int:
        return len(self.parents)

    def add(self, parents: Sequence[int], n_fixed: int) -> tuple[torch.Tensor, list[int]]:
        """Register new nodes; returns their visibility [k_new, n_fixed + k_all] and depths."""
        k0 = len(self.parents)
        for r, p in enumerate(parents):
            if not -1 <= p < k0 + r:
                raise ValueError(f"draft node {k0 + r} names parent {p}: parents are -1 (the root) "
                                 f"or an earlier node 0..{k0 + r - 1}")
        cache_parents = [n_fixed + p if p >= 0 else -1 for p in parents]
        prior = None if self.vis is None else self.vis
        self.vis = tree_visibility(cache_parents, n_fixed, prior)
        depths: list[int] = []
        for p in parents:
            depths.append(1 if p < 0 else (self.depths[p] if p < k0 else depths[p - k0]) + 1)
        self.parents += list(parents)
        self.depths += depths
        return self.vis[k0:], depths
