"""A drafter whose acceptance is chosen, for measuring a server's capacity without a real drafter's cost.

The oracle knows the target's greedy continuation of its prompt (asked of the server's plain API with the
same weights, so it works with random weights too). Each tree hangs that continuation's next ``L`` tokens
as one chain, with ``L`` drawn from a histogram of accepted lengths a real drafter reached (recorded by a
Spec-Bench run and shipped in ``data/accept_lengths.json``); after them the chain goes on with wrong
tokens, and siblings of every chain node are wrong too, until the tree has the asked number of nodes. A
greedy target's verification therefore accepts exactly ``L`` tokens (plus its bonus token), and the server
does the work of a real tree of that size. Drafting costs nothing: what is measured is the server and
the link.

If the committed text ever leaves the continuation (a batched bf16 step can break a near tie the other
way), the oracle knows nothing more and asks for plain steps; ``diverged`` counts them.
"""
from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgespec.client import Drafter, DraftRequest
from edgespec.shared.tree import ROOT, DraftTree

HISTOGRAMS = Path(__file__).parent / "data" / "accept_lengths.json"


@dataclass(frozen=True)
class AcceptHistogram:
    """How many drafted tokens a verification accepted (the bonus token not counted), and how often."""

    name: str
    counts: Mapping[int, int]

    def __post_init__(self) -> None:
        if not self.counts or any(k < 0 or v < 0 for k, v in self.counts.items()) or not sum(self.counts.values()):
            raise ValueError(f"histogram {self.name!r} needs non-negative lengths with a positive total count")

    def draw(self, rng: random.Random) -> int:
        lengths = sorted(self.counts)
        return rng.choices(lengths, weights=[self.counts[k] for k in lengths])[0]

    def mean(self) -> float:
        """Mean accepted drafted tokens per verification; tau (tokens per verification) is this + 1."""
        return sum(k * v for k, v in self.counts.items()) / sum(self.counts.values())

    @staticmethod
    def fixed(length: int) -> "AcceptHistogram":
        return AcceptHistogram(f"fixed{length}", {length: 1})


def load_histograms(path: Path = HISTOGRAMS) -> dict[str, AcceptHistogram]:
    data = json.loads(path.read_text())
    return {name: AcceptHistogram(name, {int(k): v for k, v in entry["accepted"].items()})
            for name, entry in data["histograms"].items()}


def histogram(name: str) -> AcceptHistogram:
    """A shipped histogram by name, or ``fixedN``: every verification accepts N."""
    if name.startswith("fixed") and name[5:].isdigit():
        return AcceptHistogram.fixed(int(name[5:]))
    shipped = load_histograms()
    if name not in shipped:
        raise ValueError(f"no accepted-length histogram {name!r}; shipped: {', '.join(sorted(shipped))}, or fixedN")
    return shipped[name]


def oracle_tree(truth: Sequence[int], accept: int, nodes: int, depth: int, vocab_size: int) -> DraftTree:
    """A tree whose first ``accept`` chain tokens are ``truth``'s and every other node is wrong: a chain of
    ``depth`` (at least ``accept`` + 1 where ``truth`` goes on, so the target rejects right after), then
    wrong siblings level by level until ``nodes``. ``truth``: the target's next tokens (may be short)."""
    accept = min(accept, len(truth), depth, nodes)
    depth = min(max(depth, accept + 1 if accept < len(truth) else accept), nodes)
    tokens, parents = [], []

    def wrong(position: int, k: int) -> int:  # the k-th wrong token at a position (k >= 1)
        right = truth[position] if position < len(truth) else 0
        return (right + k) % vocab_size

    for level in range(depth):
        tokens.append(truth[level] if level < accept else wrong(level, 1))
        parents.append(ROOT if level == 0 else level - 1)
    k = 2
    while len(tokens) < nodes:  # wrong siblings of the chain's nodes, each level in turn, a new token each round
        for level in range(depth):
            if len(tokens) == nodes or k >= vocab_size:
                break
            tokens.append(wrong(level, k))
            parents.append(ROOT if level == 0 else level - 1)
        k += 1
        if k >= vocab_size:
            break
    return DraftTree(tuple(tokens), tuple(parents))


class OracleDrafter(Drafter):
    """Drafts ``prompt``'s known greedy ``continuation`` with accepted lengths drawn from ``accept``: trees of at
    most ``nodes`` nodes and ``depth`` levels, within the depth the client's planner asks for (two nodes a
    level at most, as an EAGLE-2 tree of branch 2)."""

    name = "oracle"

    def __init__(self, prompt_ids: Sequence[int], continuation: Sequence[int], accept: AcceptHistogram,
                 vocab_size: int, nodes: int = 16, depth: int = 8, seed: int = 0):
        if nodes < 1 or depth < 1:
            raise ValueError(f"an oracle tree needs at least one node and one level, got {nodes} and {depth}")
        self.prompt_len = len(prompt_ids)
        self.continuation = list(continuation)
        self.accept, self.vocab_size, self.nodes, self.depth = accept, vocab_size, nodes, depth
        self.rng = random.Random(seed)
        self.asked: list[int] = []  # accepted length drawn per tree
        self.diverged = 0  # proposals made after the committed text left the continuation (plain steps)

    def propose(self, request: DraftRequest) -> DraftTree:
        made = list(request.committed[self.prompt_len:])
        if made != self.continuation[:len(made)]:
            self.diverged += 1
            return DraftTree((), ())
        truth = self.continuation[len(made):]
        if not truth:
            return DraftTree((), ())
        want = self.accept.draw(self.rng)
        depth = max(1, min(self.depth, request.max_depth))  # the client's planner caps the depth (load, costs)
        # ... and the nodes with it, as an EAGLE-2 tree of branch 2 is at most two nodes a level
        nodes = min(self.nodes, request.max_nodes, 2 * depth)
        tree = oracle_tree(truth, want, nodes, depth, self.vocab_size)
        self.asked.append(min(want, len(truth), depth))
        return tree
