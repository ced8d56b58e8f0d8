"""EAGLE-2 dynamic draft trees, for any drafter that gives next-token distributions.

The tree grows one depth at a time. At depth 1 the root's top-B tokens are the
candidates. At each further depth the B candidates of the previous depth with the
best cumulative log-probability (the *frontier*) are expanded: each gets its top-B
children, so B*B new candidates, whose score is the parent's score plus their own
log-probability. After depth D (or when even the best frontier path has become
improbable) the best M candidates overall are kept. A child never scores above
its parent (log-probabilities are <= 0), so the kept set is a connected tree.

Under a grammar (``constraint``) every row of log-probabilities is masked by what the grammar allows
after that candidate's path and renormalised, so the drafter proposes only tokens the target's
verification can accept, ranked by its distribution within the grammar.

Only frontier candidates are ever fed to the drafter's model, so a drafter keeps
KV for those alone; ``expand`` receives their indices in ``Candidates``. Candidates
are numbered the way ``DraftTree`` numbers nodes (parent ROOT = the last committed
token), so the tree drafted and the nodes fed are both ``Candidates.subtree``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.wire import MAX_NODES


@dataclass(frozen=True)
class TreeShape:
    """EAGLE-2 settings. Defaults measured on a 2-core CPU with the 0.5B (int8) drafting for the 1.5B
    target (``edgespec bench independent``, 3 HumanEval + 3 MT-Bench prompts,
    est. tokens/s 1.26 for 3x12x24@0.05 against 1.52 for 2x12x16@0.15): on a CPU a drafter pass costs
    more with every extra frontier token and the verifier pays for every extra node, so a narrow,
    deep tree that stops once its best path is improbable beats a wide one. Where to stop: one more
    pass (~80 ms) adds at most the frontier's path probability in expected accepted tokens, so it pays
    only above the cycle's own rate (~5 tokens/s x 80 ms = 0.4). Measured on 4 + 4 prompts, 48 tokens:
    min_prob 0.15 / 0.25 / 0.35 / 0.45 -> 6.13 / 5.32 / 4.84 / 4.23 drafter passes per tree, tau 5.37 /
    5.08 / 5.01 / 4.64, i.e. 6.1 / 6.2 / 6.45 / 6.4 tokens/s at 80 ms a pass and 390 ms a verification.
    End to end (``edgespec bench drafting``, 20 HumanEval + 20 MT-Bench, 32 tokens): 0.35 gave
    1.34x transformers' assisted generation at tau 4.82 (below its 5.04), 0.2 gave 1.33x at tau 5.27:
    0.2 keeps the speed and drafts longer than the chains it is compared with."""

    branch: int = 2  # B: children per expanded node, and frontier nodes expanded per depth
    depth: int = 12  # D: deepest level drafted (drafter forward passes per tree, beyond the root's)
    max_nodes: int = 16  # M: nodes kept in the final tree (verify cost grows with it)
    min_prob: float = 0.2  # stop deepening when the best frontier path's probability falls below this
    prune_frontier: bool = True  # and do not feed the frontier paths below it: on a CPU every token in a
    # drafter pass costs time, and a path that improbable adds little to the expected accepted length

    def __post_init__(self) -> None:
        if self.branch < 1 or self.depth < 1 or self.max_nodes < 1:
            raise ValueError(f"tree shape needs branch, depth and max_nodes >= 1, got {self}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"min_prob must be in [0, 1), got {self.min_prob}")


@dataclass
class Candidates:
    """Every node considered so far; parents refer to earlier candidates (or ROOT)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # cumulative log-probability from the root
    depths: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)  # the candidates select_tree kept, in the tree's node order

    def kept_scores(self) -> list[float]:
        """Cumulative log-probability of each node of the tree select_tree made (drafting ahead guesses from it)."""
        return [self.scores[i] for i in self.kept]

    def add(self, token: int, parent: int, score: float, depth: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.scores.append(float(score))
        self.depths.append(int(depth))
        return len(self.tokens) - 1

    def tree(self) -> DraftTree:
        return DraftTree(tuple(self.tokens), tuple(self.parents))

    def ancestors(self, i: int) -> list[int]:
        """Candidate indices from the depth-1 ancestor down to i (inclusive)."""
        return self.tree().ancestors(i)

    def subtree(self, nodes: Sequence[int]) -> DraftTree:
        """The candidates ``nodes`` (each after its parent, which is among them or ROOT) as a tree of their own,
        numbered in the order given."""
        where = {ROOT: ROOT}
        for n, c in enumerate(nodes):
            if self.parents[c] not in where:
                raise ValueError(f"node {c} is kept without its parent {self.parents[c]}")
            where[c] = n
        return DraftTree(tuple(self.tokens[c] for c in nodes), tuple(where[self.parents[c]] for c in nodes))


# expand(frontier candidate indices, candidates) -> log-probabilities [len(frontier), V]
Expand = Callable[[list[int], Candidates], torch.Tensor]


class DraftConstraint(Protocol):
    """What a grammar allows after the committed tokens and each of some paths (target token ids)."""

    def path_masks(self, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """[len(paths), V_target] bool."""


def constrain(logprobs: torch.Tensor, paths: Sequence[Sequence[int]], constraint: DraftConstraint,
              to_target: Sequence[int] | None = None) -> torch.Tensor:
    """logprobs [k, V'] masked to what the grammar allows after each path and renormalised; `to_target` maps
    a reduced draft vocabulary's rows to target ids (paths are target ids already). A row whose path the
    grammar allows nothing after stays all -inf."""
    allowed = constraint.path_masks(paths)  # [k, V_target]
    if to_target is not None:
        allowed = allowed[:, torch.as_tensor(to_target, dtype=torch.long)]
    width = logprobs.shape[-1]
    if allowed.shape[-1] < width:  # a drafter head wider than the target's vocabulary: its extra rows are no token
        allowed = torch.cat([allowed, allowed.new_zeros(allowed.shape[0], width - allowed.shape[-1])], -1)
    masked = logprobs.float().masked_fill(~allowed[:, :width].to(logprobs.device), -math.inf)
    norm = torch.logsumexp(masked, -1, keepdim=True)
    return torch.where(torch.isfinite(norm), masked - norm, masked)


def build_tree(root_logprobs: torch.Tensor, expand: Expand, shape: TreeShape,
               max_nodes: int | None = None, max_depth: int | None = None,
               constraint: DraftConstraint | None = None,
               to_target: Sequence[int] | None = None, ahead: bool = False,
               stop: Callable[[DraftTree], bool] | None = None,
               floors: Sequence[float] | None = None) -> tuple[DraftTree, Candidates]:
    """Grow candidates EAGLE-2 style and keep the best; returns the tree and all candidates. With a
    constraint (a grammar) only tokens it allows are candidates; `to_target` maps candidate ids (rows of a
    reduced draft vocabulary) to target ids.

    stop: asked before each pass after the first level, with every candidate so far as a tree of target ids;
    True ends the growing there and keeps the best of what is there (``DraftRequest.stop``).

    floors: in place of the shape's min_prob, [i] is the least probability a path of depth i + 1 must have to be
    drafted a level deeper (the last holds beyond; ``DraftRequest.path_floors``).

    ahead: the tree is drafted ahead (``DraftRequest.ahead``) and its first level guesses the bonus token:
    that level comes on top of the shape (one level more, ``branch`` nodes more) and paths are judged
    against min_prob from below it, as the tree the loop will send hangs from there."""
    # root_logprobs: [V]
    extra = 1 if ahead else 0
    depth_limit = shape.depth + extra if max_depth is None else min(shape.depth + extra, max_depth)
    keep = (shape.max_nodes if max_nodes is None else min(shape.max_nodes, max_nodes)) + extra * shape.branch
    cands = Candidates()
    if depth_limit < 1 or keep < 1:
        return DraftTree((), ()), cands
    target_id = (lambda t: t) if to_target is None else (lambda t: int(to_target[t]))
    if constraint is not None:
        root_logprobs = constrain(root_logprobs[None], [[]], constraint, to_target)[0]
    floor_at = [math.log(p) if p > 0 else -math.inf for p in (floors or (shape.min_prob,))]

    def judged(c: int) -> float:  # the path's log-probability below the guessed bonus level, if any
        return cands.scores[c] - (cands.scores[cands.ancestors(c)[0]] if extra else 0.0)
    top_lp, top_tok = root_logprobs.float().topk(min(shape.branch, root_logprobs.shape[-1]))
    layer = [cands.add(t, ROOT, lp, 1) for lp, t in zip(top_lp.tolist(), top_tok.tolist()) if lp > -math.inf]
    for depth in range(2, depth_limit + 1):
        if stop is not None and stop(DraftTree(tuple(target_id(t) for t in cands.tokens), tuple(cands.parents))):
            break
        frontier = sorted(layer, key=lambda i: -cands.scores[i])[: shape.branch]
        floor = floor_at[min(max(0, depth - extra - 2), len(floor_at) - 1)]  # the frontier's depth in the tree sent
        if not frontier or max(judged(c) for c in frontier) < floor:
            break
        if shape.prune_frontier:
            frontier = [c for c in frontier if judged(c) >= floor]
        if len(cands.tokens) + len(frontier) * shape.branch > MAX_NODES:
            break  # candidate 255 would read as ROOT
        logprobs = expand(frontier, cands).float()  # [k, V]
        if constraint is not None:
            paths = [[target_id(cands.tokens[a]) for a in cands.ancestors(c)] for c in frontier]
            logprobs = constrain(logprobs, paths, constraint, to_target)
        top_lp, top_tok = logprobs.topk(min(shape.branch, logprobs.shape[-1]), dim=-1)  # [k, B]
        layer = []
        for row, parent in enumerate(frontier):
            base = cands.scores[parent]
            for lp, t in zip(top_lp[row].tolist(), top_tok[row].tolist()):
                if lp > -math.inf:  # the grammar allows nothing more on this path
                    layer.append(cands.add(t, parent, base + lp, depth))
    return select_tree(cands, keep), cands


def select_tree(cands: Candidates, keep: int) -> DraftTree:
    """The best `keep` candidates by score as a tree (ties go to the shallower, earlier node). A child
    never scores above its parent with log-probabilities; scores that do (NaN) raise ValueError."""
    ranked = sorted(range(len(cands.tokens)), key=lambda i: (-cands.scores[i], cands.depths[i], i))
    cands.kept = sorted(ranked[:keep])  # candidate order is depth order: parents first
    return cands.subtree(cands.kept)
