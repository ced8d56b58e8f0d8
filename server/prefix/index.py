"""PrefixIndex: a radix tree over token ids that finds the longest stored prefix of a prompt.

Why a radix tree and not vLLM's hashed block chain: vLLM hashes blocks because its KV is paged (a
block of tokens is a block of memory, shared between requests). Here a cached prefix is one
contiguous copy of a session's KV, so blocks would buy no sharing, and matching by block would lose
up to a block of tokens per hit. The tree matches to the token (as SGLang's RadixAttention does),
needs no hash (no collision to check), and costs one dict look-up per edge walked.

Entries sit at leaves only: an entry whose ids are a prefix of another's is redundant (the longer
one's KV starts with the same rows), so adding the longer one removes it, and adding a prefix of a
stored entry adds nothing. Any point of the tree is then covered by every leaf below it, which is
what ``longest`` returns.

Not thread-safe: ``PrefixCache`` serialises calls.
"""
from __future__ import annotations

from typing import Generic, Sequence, TypeVar

V = TypeVar("V")


class _Node(Generic[V]):
    __slots__ = ("edge", "children", "parent", "value")

    def __init__(self, edge: tuple[int, ...], parent: "_Node[V] | None"):
        self.edge = edge  # the ids from the parent to here
        self.children: dict[int, _Node[V]] = {}  # by the first id of the child's edge
        self.parent = parent
        self.value: V | None = None  # leaves only


def _shared(ids: Sequence[int], start: int, edge: tuple[int, ...]) -> int:
    """How many leading ids of edge equal ids[start:]."""
    n = min(len(edge), len(ids) - start)
    if tuple(ids[start:start + n]) == edge[:n]:  # the common case, compared in C
        return n
    return next(k for k in range(n) if ids[start + k] != edge[k])


class PrefixIndex(Generic[V]):
    """Values stored under token-id sequences, none of them a prefix of another."""

    def __init__(self) -> None:
        self._root: _Node[V] = _Node((), None)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _walk(self, ids: Sequence[int]) -> tuple[_Node[V], int, int]:
        """(node, matched, into): ids[:matched] is in the tree and ends `into` ids down the edge of node
        (0: at node itself; 0 < into < len(node.edge): inside its edge)."""
        node, i = self._root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                return node, i, 0
            k = _shared(ids, i, child.edge)
            if k < len(child.edge):
                return child, i + k, k
            node, i = child, i + k
        return node, i, 0

    def longest(self, ids: Sequence[int]) -> tuple[V | None, int]:
        """A value whose ids share the longest prefix with `ids`, and that prefix's length (0: none)."""
        node, matched, _ = self._walk(ids)
        if matched == 0:
            return None, 0
        while node.value is None:  # every leaf below covers the match; any will do
            node = next(iter(node.children.values()))
        return node.value, matched

    def covering(self, ids: Sequence[int]) -> V | None:
        """A value whose ids start with all of `ids` (equal included), or None."""
        value, matched = self.longest(ids)
        return value if ids and matched == len(ids) else None

    def add(self, ids: Sequence[int], value: V) -> list[V]:
        """Store value under ids; returns the values it replaces (one stored under a prefix of ids, if any).

        ValueError when ids are empty or a prefix of stored ids (``covering`` says which, first)."""
        if not ids:
            raise ValueError("a prefix index stores non-empty id sequences")
        node, matched, into = self._walk(ids)
        if matched == len(ids):
            raise ValueError("these ids are a prefix of stored ones: nothing to add")
        rest = tuple(ids[matched:])
        if into:  # the ids leave the tree inside node's edge: split it there
            node = self._split(node, into)
        replaced: list[V] = []
        if node.value is not None:  # a stored prefix of ids: the new leaf takes over its node
            replaced.append(node.value)
            node.edge += rest
            node.value = value
            return replaced
        leaf: _Node[V] = _Node(rest, node)
        leaf.value = value
        node.children[rest[0]] = leaf
        self._size += 1
        return replaced

    def remove(self, ids: Sequence[int]) -> V:
        """Remove and return the value stored under exactly these ids; KeyError when there is none."""
        node, matched, into = self._walk(ids)
        if matched != len(ids) or into or node.value is None or not ids:
            raise KeyError("no value is stored under these ids")
        value, node.value = node.value, None
        self._size -= 1
        parent = node.parent
        assert parent is not None
        del parent.children[node.edge[0]]
        self._tidy(parent)
        return value

    def _split(self, node: _Node[V], at: int) -> _Node[V]:
        """Put a new node `at` ids down node's edge, above node; returns it."""
        parent = node.parent
        assert parent is not None
        middle: _Node[V] = _Node(node.edge[:at], parent)
        parent.children[middle.edge[0]] = middle
        node.edge = node.edge[at:]
        node.parent = middle
        middle.children[node.edge[0]] = node
        return middle

    def _tidy(self, node: _Node[V]) -> None:
        """After a child went: drop a node left with no child, merge one left with a single child."""
        while node is not self._root and node.value is None and len(node.children) <= 1:
            parent = node.parent
            assert parent is not None
            del parent.children[node.edge[0]]
            if node.children:
                (child,) = node.children.values()
                child.edge = node.edge + child.edge
                child.parent = parent
                parent.children[child.edge[0]] = child
                return
            node = parent
