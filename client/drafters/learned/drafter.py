"""Learned drafters (EAGLE, MoA, Beagle) behind the client's ``Drafter`` interface.

The drafting runtimes (``runtime.LearnedRuntime``: ``eagle_runtime``, ``moa_runtime``,
``beagle_runtime``) keep their own caches over the committed text and the target's
features; this adapter keeps them in step with the generation loop:

- ``start`` / ``observe`` / ``resync`` hand them the committed tokens with the features
  the server sent (which lag one token behind the committed text);
- ``propose`` grows an EAGLE-2 tree from their next-token distributions, in the
  runtime's (possibly reduced) draft vocabulary, and maps it to target ids;
- ``generate_offline`` commits tokens without features: the runtime carries on from
  its own predictions (EAGLE's predicted hidden state, Beagle's predicted state; MoA's
  token-only self-attention and, for TLI, the target layers' own K/V).

Whenever the loop's committed text and the runtime's disagree (a rollback, a resume,
a verification that did not follow the last proposal), the runtime rolls back to the
common prefix and catches up, so no path can leave it out of step.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from edgespec.client.drafters.base import Drafter, DraftRequest, Verification, common_prefix
from edgespec.client.drafters.tree_builder import Candidates, TreeShape, build_tree
from edgespec.shared.errors import EdgespecError
from edgespec.shared.session_settings import FeatureRequest
from edgespec.shared.tree import DraftTree

from .runtime import LearnedRuntime


class MissingFeaturesError(EdgespecError, grpc_code="FAILED_PRECONDITION"):
    """The server sent no features for a drafter that cannot work without them."""


class LearnedDrafter(Drafter):
    can_generate_offline = True
    stops_by_path = True

    def __init__(self, name: str, runtime: LearnedRuntime, needs: FeatureRequest, tree: TreeShape = TreeShape(),
                 context_vocab: bool = True):
        self.name = name
        self.rt = runtime
        self.needs = needs
        self.tree = tree
        # With a reduced draft vocabulary, the committed text's ids the list lacks are drafted too (the prompt's
        # identifiers, which code answers copy); a router's groups cover its list only, so not with a router.
        self.context_vocab = context_vocab
        self._scores: list[float] = []  # cumulative log-probability of each node of the last tree
        self._to_target: list[int] | None = runtime.parts.draft_to_target()  # draft index -> target id

    def _add_context_ids(self, committed: Sequence[int]) -> None:
        if self.context_vocab and self.rt.routed is None and self.rt.parts.set_context_ids(committed):
            self._to_target = self.rt.parts.draft_to_target()

    def feature_request(self) -> FeatureRequest:
        return self.needs

    # -- keeping the runtime in step ------------------------------------------------------------
    def _features(self, features: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        if not features or self.rt.feature not in features:
            return None
        return {k: v.float() for k, v in features.items()}

    def start(self, prompt_ids: Sequence[int], first_token: int, features: Mapping[str, torch.Tensor]) -> None:
        feats = self._features(features)
        if feats is None:
            raise MissingFeaturesError(
                f"the {self.name!r} drafter needs the target's {self.rt.feature!r} features, and the server's "
                f"Opened carried {sorted(features) or 'none'}: is the server too old, or did it refuse the feature "
                f"request?")
        self.rt.reset()
        self._add_context_ids([*prompt_ids, first_token])
        self.rt.commit([*prompt_ids, first_token], feats)

    def rewind(self, committed: Sequence[int]) -> None:
        """Drafting ahead committed a guessed path without features (the runtime's own predictions stand in
        for them, as offline): roll back to the text the verified tree hung from, so ``observe`` commits the
        target's features for the tokens it accepted."""
        if len(self.rt.tokens) > len(committed):
            self.rt.rollback(max(1, common_prefix(self.rt.tokens, committed)))

    def tree_scores(self) -> list[float]:
        """The runtime's cumulative log-probabilities. What a learned drafter can guess is the accepted path and
        bonus token; what it cannot is the target's features of them, which come only with the verdict: a
        tree drafted ahead grows from the runtime's own predicted features, as offline."""
        return list(self._scores)

    def observe(self, verification: Verification) -> None:
        new = [*verification.accepted_tokens, verification.bonus_token]
        before = list(verification.committed[: len(verification.committed) - len(new)])
        self.rewind(before)
        feats = self._features(verification.features)
        if feats is not None and self.rt.tokens == before:
            self.rt.commit(new, feats)
        else:  # the loop moved on in a way the runtime did not see: catch up without features
            self._sync(verification.committed)

    def resync(self, committed: Sequence[int], kept: int, features: Mapping[str, torch.Tensor]) -> None:
        feats = self._features(features)
        if feats is None:
            self._sync(committed)
            return
        rows = feats[self.rt.feature].shape[0]
        start = len(committed) - 1 - rows  # Resumed's features cover start .. len(committed) - 2
        keep = max(1, min(kept, start + 1, common_prefix(self.rt.tokens, committed)))
        self.rt.rollback(keep)
        if self.rt.length <= start:  # tokens the features do not reach: committed from predictions first
            self.rt.commit(list(committed[self.rt.length: start + 1]), None)
        self.rt.commit(list(committed[self.rt.length:]), feats, features_from=start)

    def _sync(self, committed: Sequence[int]) -> None:
        """Make the runtime hold exactly ``committed``, new tokens without features."""
        self._add_context_ids(committed)
        tokens = self.rt.tokens
        if tokens != list(committed[: len(tokens)]):
            keep = common_prefix(tokens, committed)
            if keep < 1:
                raise EdgespecError(f"the {self.name!r} drafter was started on another prompt")
            self.rt.rollback(keep)
        if self.rt.length < len(committed):
            self.rt.commit(list(committed[self.rt.length:]), None)

    # -- drafting -------------------------------------------------------------------------------
    def _target_id(self, draft_index: int) -> int:
        return draft_index if self._to_target is None else self._to_target[draft_index]

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftTree:
        self._sync(request.committed)
        fed: list[int] = []  # candidates fed to the runtime: its draft node i is candidate fed[i]

        def expand(frontier: list[int], cands: Candidates) -> torch.Tensor:
            k0 = len(fed)
            fed.extend(frontier)
            nodes = cands.subtree(fed)
            return self.rt.expand([self._target_id(t) for t in nodes.tokens[k0:]], nodes.parents[k0:])

        try:
            tree, cands = build_tree(self.rt.root_logprobs(), expand, self.tree, request.max_nodes, request.max_depth,
                                     request.constraint, self._to_target, ahead=request.ahead,
                                     stop=request.stop, floors=request.path_floors)
        finally:
            self.rt.clear_draft()
        self._scores = cands.kept_scores()
        return DraftTree(tuple(self._target_id(t) for t in tree.tokens), tree.parents)

    @torch.inference_mode()
    def generate_offline(self, committed: Sequence[int]) -> int:
        self._sync(committed)
        return self._target_id(int(self.rt.root_logprobs().argmax()))

    def close(self) -> None:
        self.rt.reset()
