"""The boundary between drafting and the generation loop.

A drafter proposes a tree from the current state and observes what the target
made of it; the loop never needs to know which drafter it drives. Words:

- committed: prompt + generated token ids the client holds as settled; the last
  one is the root the next tree hangs from.
- features: decoded target activations by name (``edgespec.shared.wire``: HIDDEN,
  LSA, TLI_K, TLI_V). They lag one token: they cover every committed token except the last.
  Opened brings the prompt's, Verified those of the tree root and the accepted
  nodes, Resumed those from (confirmed length - 1) up to the new last token.

Learned drafters (EAGLE, MoA) declare the features they need with
``feature_request()`` and read them in ``start`` / ``observe`` / ``resync``.

Drafting ahead (``loop/generation.py``, proto/README.md): while a tree is out for verification the loop may call
``propose`` again on a *guessed* committed text (the tree's likely accepted path), using ``tree_scores`` to
guess. A drafter that returns scores promises that this is safe: its state follows the committed text each
call gives it, and ``rewind`` drops whatever the guess left behind.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

from edgespec.shared.errors import EdgespecError
from edgespec.shared.session_settings import FeatureRequest
from edgespec.shared.tree import DraftTree


class OfflineUnsupportedError(EdgespecError, grpc_code="UNAVAILABLE"):
    """The drafter cannot generate without the server (it only proposes, e.g. ngram lookup)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share: how much of a drafter's state still follows the committed text."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass(frozen=True)
class DraftRequest:
    """What the loop tells the drafter before each proposal."""

    committed: Sequence[int]  # all committed ids; the last is the tree root
    max_nodes: int  # the server's limit on nodes per tree
    max_depth: int  # no point in drafting deeper than the tokens still wanted
    constraint: object | None = None  # the grammar (tree_builder.DraftConstraint): draft only what it allows
    ahead: bool = False  # drafted ahead from a guessed text: the first level guesses the target's bonus token,
    # so a drafter that stops on improbable paths judges them from the level below it
    stop: Callable[[DraftTree], bool] | None = None  # drafting ahead: asked before each further pass with every
    # candidate so far (target ids, the ones left out of the tree too); True: the verdict came and no candidate
    # can match it, so the drafter returns what it has at once (its time is the next tree's now)
    path_floors: tuple[float, ...] = ()  # where to stop deepening, from the loop's costs (tree_size.path_floors):
    # [i] is the least probability the best path of depth i + 1 must have to be drafted a level deeper, in place
    # of a drafter's own min_prob; (): the drafter's own
    free_depth: int = 0  # how deep paths that cost no drafting (a lookup's copies) may go: the tokens the step may
    # still commit less its bonus token, past the planner's max_depth; 0: max_depth


@dataclass(frozen=True)
class Verification:
    """The target's answer to one tree, as the drafter sees it."""

    tree: DraftTree  # the tree that was verified
    accepted: Sequence[int]  # accepted node indices, root to leaf
    bonus_token: int  # the target's token after the last accepted node
    committed: Sequence[int]  # committed ids after this verification (accepted and bonus included)
    features: Mapping[str, torch.Tensor] = field(default_factory=dict)  # root + accepted nodes, by name

    @property
    def accepted_tokens(self) -> list[int]:
        return [self.tree.tokens[i] for i in self.accepted]


class Drafter(abc.ABC):
    """One drafting strategy. Subclasses set ``name`` and implement ``propose``."""

    name: str = "drafter"
    can_generate_offline: bool = False  # True when generate_offline works without the server
    stops_by_path: bool = False  # True when propose honours DraftRequest.path_floors (a tree grown by its paths'
    # probabilities, tree_builder.build_tree); the loop caps the others' depth by the planner's alone

    def feature_request(self) -> FeatureRequest:
        """The features this drafter needs from the target (none by default)."""
        return FeatureRequest()

    def start(self, prompt_ids: Sequence[int], first_token: int, features: Mapping[str, torch.Tensor]) -> None:
        """A session opened: committed is prompt + first_token; features cover the prompt."""

    @abc.abstractmethod
    def propose(self, request: DraftRequest) -> DraftTree:
        """A tree hanging from request.committed[-1]; an empty tree asks for one plain target step."""

    def observe(self, verification: Verification) -> None:
        """The target verified the last proposal."""

    def resync(self, committed: Sequence[int], kept: int, features: Mapping[str, torch.Tensor]) -> None:
        """The committed text changed other than by a verification (resume, rollback).

        ``committed[:kept]`` is unchanged from what the drafter saw before; anything
        it derived from later tokens is stale. ``features`` are Resumed's.
        """

    def copy_tree(self, committed: Sequence[int], max_nodes: int, max_depth: int) -> DraftTree:
        """A tree that costs no drafting, for a step the loop would otherwise make plain: what the text is copying
        from itself, found by lookup (``+ngram`` drafters). The loop sends it in place of the plain step when its
        measured acceptance pays for the verification (``TreePlanner.copy_pays``). Empty (the default): none."""
        return DraftTree((), ())

    def tree_scores(self) -> Sequence[float] | None:
        """Log-probability, per node of the tree ``propose`` returned last, that the target accepts the path
        to it, as far as the drafter can tell (its own cumulative log-probability, or a frequency). None (the
        default): the drafter cannot guess, and the loop never drafts ahead for it."""
        return None

    def rewind(self, committed: Sequence[int]) -> None:
        """Proposals were made ahead from guessed texts since the drafter last saw ``committed`` (the text the
        tree now verified was proposed from): drop what they derived past it, before ``observe`` is told the
        verification. A drafter whose every call syncs to the text it is given may keep what it has."""

    def generate_offline(self, committed: Sequence[int]) -> int:
        """The next token without the server (greedy). Raises OfflineUnsupportedError if it cannot."""
        raise OfflineUnsupportedError(
            f"the {self.name!r} drafter cannot generate without the server: it only proposes tokens for the target "
            f"to check. Use a drafter with a model (e.g. --drafter independent) to keep going offline.")

    def close(self) -> None:
        """Free what the drafter holds (models stay loaded; caches go)."""
