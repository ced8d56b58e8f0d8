"""A verification's verdict, as pure functions: guessed before it comes, and what it commits when it does.

A verdict is the accepted path (a root-to-node path of the tree, maybe empty) and the bonus token after it.

Guessing it. While a tree is out for verification the client drafts the next one from a guess
(client/README.md, "The pipeline and the planner"). The guess is the path: the drafter's scores give each
node's chance that the target accepts the path to it, p(n), so the chance that the accepted path ends exactly
at n is p(n) minus what its children take, sum of p(c). The bonus token is not guessed one by one: the tree
drafted ahead hangs from the guessed path's last token, so its depth-1 nodes are the drafter's most likely
bonus tokens, and a verdict whose bonus is one of them sends the part of that tree below it (``tree_after``),
re-rooted on the bonus. A verdict that accepted more than the guessed path is a hit too when the tree drafted
ahead holds those tokens and the bonus after them: it sends what is below them. One tree drafted ahead thereby
covers a path, the paths longer than it, and several bonus tokens.

Committing it. What a verification or a resume commits, and when the output stops. ``committed`` is prompt +
generated ids on the client; ``confirmed`` is how many of them the server has confirmed (the rest are
provisional, made offline). Every function takes and returns plain lists, so each rule is tested on its own;
``StopStrings`` keeps the one piece of state, the text seen so far.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from edgespec.shared.text_stream import Decode, TextStream
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.wire import ResumePolicy

from edgespec.client.link.verifier import ProtocolError


# ------------------------------------------------------------------ guessing a verdict before it comes
@dataclass(frozen=True)
class Outcome:
    """A guessed accepted path."""

    path: tuple[int, ...]  # node indices of the tree, root to the last accepted node (never empty)
    probability: float  # the drafter's chance that the target accepts exactly this path


def likely_outcomes(tree: DraftTree, scores: Sequence[float], count: int, min_probability: float = 0.0
                    ) -> list[Outcome]:
    """The ``count`` most likely accepted paths of a non-empty path, most likely first (a deeper path first
    on a tie), leaving out those below ``min_probability``. ``scores``: log p(n) per node.

    The empty path is never guessed: a tree drafted ahead from the same text as ``tree`` would offer as
    bonus tokens the very depth-1 nodes the target just rejected."""
    if len(scores) != len(tree):
        raise ValueError(f"{len(scores)} scores for a tree of {len(tree)} nodes")
    p = [math.exp(s) for s in scores]
    below = [0.0] * len(tree)  # probability mass of each node's children
    for i, parent in enumerate(tree.parents):
        if parent != ROOT:
            below[parent] += p[i]
    depths = tree.depths()
    ends = sorted(range(len(tree)), key=lambda n: (-(p[n] - below[n]), -depths[n], n))
    out = []
    for n in ends[:count]:
        chance = max(0.0, p[n] - below[n])
        if chance < min_probability or chance <= 0.0:
            break
        out.append(Outcome(tuple(tree.ancestors(n)), chance))
    return out


def tree_after(tree: DraftTree, scores: Sequence[float], tokens: Sequence[int], max_nodes: int
               ) -> tuple[DraftTree, list[float]] | None:
    """The nodes below the path of ``tokens`` from the root (the accepted tokens past the guessed path, then the
    bonus token) as a tree of their own, the path's last node its root: at most ``max_nodes`` of them taken in
    node order (parents before children, so the kept ones stay connected), with their scores given that path
    (log p(n) - log p(last)). None when the tree has no such path: the guess missed."""
    if not tokens:
        raise ValueError("tree_after needs at least the bonus token")
    top = ROOT
    for token in tokens:
        first = 0 if top == ROOT else top + 1  # a child comes after its parent
        top = next((i for i in range(first, len(tree)) if tree.parents[i] == top and tree.tokens[i] == token), None)
        if top is None:
            return None
    where = {top: ROOT}  # old node -> new node (the path's last node becomes the root)
    new_tokens, parents, new_scores = [], [], []
    for i in range(top + 1, len(tree)):
        if len(new_tokens) >= max_nodes:
            break
        if tree.parents[i] in where:
            where[i] = len(new_tokens)
            new_tokens.append(tree.tokens[i])
            parents.append(where[tree.parents[i]])
            new_scores.append(scores[i] - scores[top])
    return DraftTree(tuple(new_tokens), tuple(parents)), new_scores


def may_still_hit(candidates: DraftTree, path: Sequence[int], flight: DraftTree, accepted: Sequence[int],
                  bonus: int) -> bool:
    """Can a tree drafted ahead for the guessed ``path`` (node indices of ``flight``), whose candidates so far are
    ``candidates``, still match the verdict (``accepted`` nodes of ``flight``, then ``bonus``)? No when the verdict
    did not accept the guessed path, or when the tokens it took past it and its bonus leave the candidates at a
    node that was expanded already without the next one among its children (the depth-1 nodes, the bonus
    guesses, are all there from the start). A node not expanded yet may still be: that answers yes."""
    if tuple(accepted[:len(path)]) != tuple(path):
        return False
    children: dict[int, dict[int, int]] = {}
    for i, (token, parent) in enumerate(zip(candidates.tokens, candidates.parents)):
        children.setdefault(parent, {}).setdefault(token, i)
    node = ROOT
    for token in [*(flight.tokens[i] for i in accepted[len(path):]), bonus]:
        below = children.get(node)
        if not below:
            return node != ROOT  # not expanded yet (an empty tree has nothing to match)
        if token not in below:
            return False
        node = below[token]
    return True


# ------------------------------------------------------------------ what a verdict commits
def accepted_path(tree: DraftTree, accepted: Sequence[int]) -> list[int]:
    """Tokens of the accepted nodes, after checking they form a path from the root."""
    parent = ROOT
    for i in accepted:
        if not 0 <= i < len(tree):
            raise ProtocolError(f"server accepted node {i} of a {len(tree)}-node tree")
        if tree.parents[i] != parent:
            raise ProtocolError(f"server's accepted nodes {list(accepted)} are not a root-to-leaf path of the tree")
        parent = i
    return [tree.tokens[i] for i in accepted]


def check_committed_len(expected: int, reported: int, what: str) -> None:
    if expected != reported:
        raise ProtocolError(f"{what}: server reports committed_len {reported}, the client expected {expected}")


def resume_commit(committed: Sequence[int], confirmed: int, agreed: int, bonus: int,
                  policy: ResumePolicy) -> list[int]:
    """Committed ids after a Resume answered (agreed, bonus)."""
    provisional = len(committed) - confirmed
    if not 0 <= agreed <= provisional:
        raise ProtocolError(f"server agreed with {agreed} of {provisional} provisional tokens")
    kept = len(committed) if policy is ResumePolicy.KEEP else confirmed + agreed
    return list(committed[:kept]) + [int(bonus)]


@dataclass(frozen=True)
class Finish:
    """Where the output ends, if it does."""

    keep: int  # generated tokens that stay
    reason: str | None  # "stop" (EOS or stop string), "length", or None (not finished)


class StopStrings:
    """Whether the generated text has reached a stop string, fed a token at a time through the APIs' own
    ``TextStream`` (incremental decoding, one automaton for all stops), so the loop ends exactly where the
    APIs cut the text and a token costs the same late in a long answer as early on."""

    def __init__(self, decode: Decode, stops: Sequence[str]):
        self.decode, self.stops = decode, tuple(stops)
        self._fed = 0  # tokens of generated[] the stream has seen
        self._stream = TextStream(decode, self.stops)

    def reached(self, generated: Sequence[int], k: int) -> bool:
        """Does the text of generated[: k + 1] hold a stop string? Calls come with k rising; a k below what was
        seen means the text from k on changed (a rollback), so the stream starts again from generated[:k]."""
        if self._fed != k:
            self._stream, self._fed = TextStream(self.decode, self.stops), k
            for token in generated[:k]:
                self._stream.push(token)
        self._stream.push(generated[k])
        self._fed += 1
        return self._stream.stopped


def finish_point(generated: Sequence[int], checked: int, eos_ids: set[int], max_new_tokens: int,
                 stops: StopStrings | None = None, ignore_eos: bool = False, stop_ids: Sequence[int] = (),
                 min_tokens: int = 0) -> Finish:
    """Earliest end among tokens generated[checked:] (earlier ones were checked before).

    EOS (and a stop id, vLLM's stop_token_ids) is kept as the last token (as Hugging Face's greedy output
    keeps it); a stop string ends the output with the token that completes it (the text is cut before it
    where it is shown); past max_new_tokens nothing is kept. Before min_tokens tokens nothing ends the
    output but the length (vLLM's min_tokens: its stop checks start there).
    """
    limit = min(len(generated), max_new_tokens)
    for k in range(max(checked, min_tokens - 1), limit):
        if ((not ignore_eos and generated[k] in eos_ids) or generated[k] in stop_ids
                or (stops is not None and stops.reached(generated, k))):
            return Finish(k + 1, "stop")
    if limit >= max_new_tokens:
        return Finish(max_new_tokens, "length")
    return Finish(len(generated), None)
