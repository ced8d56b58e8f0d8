"""Draft trees: the type, its 4-bytes-a-node wire form, tree attention masks and positions.

Words used here:
- root: the last committed token. It is not a node of the tree; every node hangs
  below it, and its parent index on the wire is 255 (``ROOT``).
- node i: ``tokens[i]`` with parent ``parents[i]`` (an earlier node, or ROOT).
  Parents come before children, so node order is a topological order.
- depth: the root has depth 0, its children depth 1, and so on.

The verifier feeds ``[root] + nodes`` (1 + N tokens) after the committed
context (whose KV is cached): row 0 of the mask is the root, row 1 + i node i.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .errors import InvalidTreeError
# The tree's wire limits (``shared.wire``), also named where trees are.
from .wire import MAX_NODES, MAX_TOKEN_ID, NODE_BYTES, ROOT  # noqa: F401


@dataclass(frozen=True)
class DraftTree:
    """A draft token tree. ``parents[i]`` is ROOT or an index < i."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "DraftTree":
        """A tree that is a single chain: each token the child of the one before."""
        return cls(tuple(tokens), tuple([ROOT] + list(range(len(tokens) - 1))) if tokens else ())

    def validate(self, vocab_size: int | None = None, max_nodes: int = MAX_NODES) -> "DraftTree":
        """Raise InvalidTreeError naming the first problem; return self when valid."""
        if len(self.tokens) != len(self.parents):
            raise InvalidTreeError(f"tree has {len(self.tokens)} tokens but {len(self.parents)} parents")
        if len(self.tokens) > min(max_nodes, MAX_NODES):
            raise InvalidTreeError(f"tree has {len(self.tokens)} nodes; the limit is {min(max_nodes, MAX_NODES)}")
        limit = MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
        for i, (tok, par) in enumerate(zip(self.tokens, self.parents)):
            if not 0 <= tok <= limit:
                raise InvalidTreeError(f"node {i}: token id {tok} is outside the vocabulary [0, {limit}]")
            if par != ROOT and not 0 <= par < i:
                raise InvalidTreeError(
                    f"node {i}: parent {par} does not come before it (parents must precede children, "
                    f"or be {ROOT} for the last committed token)")
        return self

    def depths(self) -> list[int]:
        """Depth of each node (children of the root have depth 1)."""
        out: list[int] = []
        for par in self.parents:
            out.append(1 if par == ROOT else out[par] + 1)
        return out

    def children(self) -> list[list[int]]:
        """children()[0] lists the root's children; children()[1 + i] node i's, in node order."""
        out: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, par in enumerate(self.parents):
            out[0 if par == ROOT else par + 1].append(i)
        return out

    def ancestors(self, i: int) -> list[int]:
        """Node indices from the root's child down to node i (inclusive)."""
        path = []
        while i != ROOT:
            path.append(i)
            i = self.parents[i]
        return path[::-1]

    def paths(self) -> list[list[int]]:
        """Root-to-leaf paths as lists of node indices, leaves in node order."""
        has_child = {p for p in self.parents if p != ROOT}
        return [self.ancestors(i) for i in range(len(self)) if i not in has_child]


def encode_tree(tree: DraftTree) -> bytes:
    """Wire form: per node, 3-byte little-endian token id then 1-byte parent."""
    tree.validate()
    out = bytearray(NODE_BYTES * len(tree))
    for i, (tok, par) in enumerate(zip(tree.tokens, tree.parents)):
        out[4 * i: 4 * i + 3] = tok.to_bytes(3, "little")
        out[4 * i + 3] = par
    return bytes(out)


def decode_tree(data: bytes, vocab_size: int | None = None, max_nodes: int = MAX_NODES) -> DraftTree:
    """Parse and validate the wire form; InvalidTreeError names what is wrong."""
    if len(data) % NODE_BYTES:
        raise InvalidTreeError(
            f"tree bytes are truncated: {len(data)} bytes is not a multiple of {NODE_BYTES} (4 bytes a node)")
    n = len(data) // NODE_BYTES
    if n > MAX_NODES:
        raise InvalidTreeError(f"tree has {n} nodes; the limit is {MAX_NODES}")
    tokens = [int.from_bytes(data[4 * i: 4 * i + 3], "little") for i in range(n)]
    parents = [data[4 * i + 3] for i in range(n)]
    return DraftTree(tuple(tokens), tuple(parents)).validate(vocab_size, max_nodes)


def tree_attention_mask(tree: DraftTree) -> torch.Tensor:
    """Boolean [1 + N, 1 + N] mask over [root] + nodes: True where row may attend column.

    A node sees the root, its ancestors and itself; the root sees itself.
    """
    n = len(tree)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i, par in enumerate(tree.parents):
        row = i + 1
        if par != ROOT:
            mask[row] = mask[par + 1]
        mask[row, row] = True
    return mask
