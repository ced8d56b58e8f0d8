"""What every learned drafting runtime (EAGLE, MoA, Beagle) keeps the same way.

A runtime holds its caches over the committed tokens and the target's features, and
drafts a tree on top of them:

    rt.commit(prompt_ids + [first], features)     # features by name (the wire's), or a tensor
                                                  #  of the runtime's own feature; they lag one token
    lp = rt.root_logprobs()                       # [V'] the token after the last committed one
    lps = rt.expand(tokens, parents)              # [k, V'] after each new draft node (target ids)
    rt.commit(accepted + [bonus], features)       # features of the newly covered tokens
    rt.commit([tok], None)                        # offline: the runtime's own predictions stand in
    rt.commit(tokens, features, features_from=p)  # features of positions p.. (a resume)
    rt.rollback(n)                                # keep the first n committed tokens
    rt.attach_router(router)                      # CORAL's LM-head router; None detaches it

Draft nodes follow ``DraftTree``: node i is the i-th token ``expand`` took since the last
``clear_draft`` and its parent is ``ROOT`` (the last committed token) or an earlier node.
Draft-vocabulary indices map to target ids with ``parts.to_target_ids``.

Features lag one token: when n tokens are committed, the target's features can cover
positions 0..n-2 at most. The base class keeps that rule, the tokens and the draft tree; a
runtime implements its own steps (``_cover``, ``_carry_on``, ``_forget``, ``_expand``,
``_root_logprobs``). ``RowsRuntime`` adds what EAGLE and Beagle share: one cache row per position.
"""
from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from edgespec.shared.drafters.target_parts import TargetParts
from edgespec.shared.errors import EdgespecError
from edgespec.shared.tree import ROOT, DraftTree, tree_attention_mask

if TYPE_CHECKING:  # CORAL's router is optional to every family: loaded where one is attached
    from edgespec.shared.drafters.router import LMHeadRouter, RoutedHead

Features = Mapping[str, torch.Tensor]


class DrafterStateError(EdgespecError, ValueError, grpc_code="FAILED_PRECONDITION"):
    """A drafter asked to do something its state does not allow (features of the wrong length,
    drafting before anything is committed, rolling back past the start)."""


class LearnedRuntime(abc.ABC):
    name: ClassVar[str]  # in messages: "EAGLE", "MoA", "Beagle"
    feature: ClassVar[str]  # the wire's feature it cannot work without (wire.HIDDEN, wire.LSA)
    batch_in_call_parents: ClassVar[bool] = True  # one forward may hold a node and its parent

    def __init__(self, parts: TargetParts):
        self.parts = parts
        self.routed: RoutedHead | None = None  # the LM head cut to a router's groups, when attached
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        self.clear_draft()

    def clear_draft(self) -> None:
        self.draft: DraftTree = DraftTree((), ())  # nodes fed since the last clear (target ids)

    @property
    def length(self) -> int:
        """Committed tokens."""
        return len(self.tokens)

    def attach_router(self, router: LMHeadRouter | RoutedHead | None) -> None:
        """Draft with a router's chosen groups of the LM head (None: the full head again).
        A RoutedHead already made for these parts is reused (no second copy of the head)."""
        from edgespec.shared.drafters.router import routed_head_for  # a drafter without a router never loads it

        self.routed = routed_head_for(router, self.parts)

    # -- committing -----------------------------------------------------------------------------
    @torch.no_grad()
    def commit(self, tokens: Sequence[int], features: Features | torch.Tensor | None = None,
               features_from: int | None = None) -> None:
        """Append committed tokens with the target's features of positions ``features_from``..
        (default: the previous last token, what a verification sends), or None (offline)."""
        feats = self._read(features)
        self.clear_draft()
        n0 = self.length
        self.tokens += self.parts.check_tokens(tokens).tolist()
        self._add_tokens(n0)
        if feats is not None:
            start = max(0, n0 - 1) if features_from is None else features_from
            k = feats[self.feature].shape[0]
            if k and (start < 0 or start + k > self.length - 1):
                raise DrafterStateError(f"features of positions {start}..{start + k - 1} do not fit: features lag "
                                        f"one token (the last of {self.length} committed has none)")
            self._cover(feats, start)
        self._carry_on()

    def _read(self, features: Features | torch.Tensor | None) -> dict[str, torch.Tensor] | None:
        if features is None:
            return None
        if isinstance(features, torch.Tensor):
            return {self.feature: features}
        if self.feature not in features:
            raise DrafterStateError(f"{self.name} needs the {self.feature!r} feature; got {sorted(features)}")
        return dict(features)

    def _add_tokens(self, n0: int) -> None:
        """Tokens n0.. were just committed (before any features of them)."""

    @abc.abstractmethod
    def _cover(self, features: dict[str, torch.Tensor], start: int) -> None:
        """Take the target's features of positions start.. (they fit the lag-one rule)."""

    @abc.abstractmethod
    def _carry_on(self) -> None:
        """Predict what the target's features do not cover yet (offline tokens, the root)."""

    @torch.no_grad()
    def rollback(self, length: int) -> None:
        """Keep the first ``length`` committed tokens (and what the runtime derived from them)."""
        if not 0 <= length <= self.length:
            raise DrafterStateError(f"cannot roll back to {length} tokens: {self.length} are committed")
        self.clear_draft()
        del self.tokens[length:]
        self._forget(length)

    @abc.abstractmethod
    def _forget(self, length: int) -> None:
        """Drop what tokens from ``length`` on made (``tokens`` is already cut)."""

    # -- drafting -------------------------------------------------------------------------------
    @torch.no_grad()
    def root_logprobs(self) -> torch.Tensor:
        """[V'] log-probabilities of the token after the last committed one."""
        self._check_ready()
        return self._root_logprobs()

    @torch.no_grad()
    def expand(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Add draft nodes (target ids; parents ROOT or earlier nodes); returns [k, V']."""
        if len(tokens) != len(parents):
            raise DrafterStateError(f"{len(tokens)} draft tokens but {len(parents)} parents")
        self._check_ready()
        ids = self.parts.check_tokens(tokens)
        k0 = len(self.draft)
        if not self.batch_in_call_parents and any(p != ROOT and p >= k0 for p in parents):
            # a node's parent must be in the cache before it: one node at a time
            return torch.cat([self.expand([t], [p]) for t, p in zip(tokens, parents)])
        self.draft = DraftTree(self.draft.tokens + tuple(ids.tolist()), self.draft.parents + tuple(parents)).validate()
        sees = tree_attention_mask(self.draft)[1 + k0:, 1:]  # [k, k0 + k]: ancestors and itself among the nodes
        vis = torch.cat([torch.ones(len(ids), self._fixed_rows(), dtype=torch.bool), sees], 1)
        return self._expand(ids, list(parents), self.draft.depths()[k0:], vis)

    @abc.abstractmethod
    def _check_ready(self) -> None:
        """Raise DrafterStateError when there is nothing to draft from yet."""

    @abc.abstractmethod
    def _root_logprobs(self) -> torch.Tensor:
        ...

    @abc.abstractmethod
    def _fixed_rows(self) -> int:
        """Cache rows before the draft nodes: every draft node sees them all."""

    @abc.abstractmethod
    def _expand(self, ids: torch.Tensor, parents: list[int], depths: list[int], vis: torch.Tensor) -> torch.Tensor:
        """One forward over new draft nodes. ids: [k]; vis: bool [k, fixed rows + all nodes]; returns [k, V']."""

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head input [T, E] -> [T, V'] (-inf outside a router's chosen groups). The head's own products
        decide its dtype; its logits come out in float32, since a bf16 drafter's logits rounded to bf16 (steps of
        0.125 at 16-32) would tie the candidates a tree ranks."""
        return self.parts.logits(hidden.float()) if self.routed is None else self.routed.logits(hidden)

    def _logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self._logits(hidden).float(), -1)


class RowsRuntime(LearnedRuntime):
    """Cache rows 0..rows-1, one a covered position in order: the target's feature of that position,
    or (offline) the runtime's own prediction of it, until a resume replaces it. In step the rows
    cover every committed token but the last (rows == length - 1)."""

    def reset(self) -> None:
        super().reset()
        self.rows: int = 0

    def _cover(self, features: dict[str, torch.Tensor], start: int) -> None:
        if start > self.rows:
            raise DrafterStateError(f"features from position {start} would leave a gap: the {self.name} runtime "
                                    f"has rows for positions 0..{self.rows - 1}")
        self._keep(start)  # rows from `start` on were predictions: the target's features replace them
        feats, missing = features[self.feature], self.length - 1 - self.rows
        if feats.shape[0] != missing:
            raise DrafterStateError(f"expected features of {missing} tokens (all committed but the last not yet "
                                    f"covered), got {feats.shape[0]}")
        self._append(feats)

    def _carry_on(self) -> None:
        for _ in range(self.length - 1 - self.rows):
            if self.rows == 0:
                raise DrafterStateError(f"the {self.name} runtime needs the target's features of at least one "
                                        f"token before it can go on from its own predictions")
            self._append(self._predicted_row())

    def _forget(self, length: int) -> None:
        self._keep(max(0, length - 1))

    def _check_ready(self) -> None:
        if self.rows == 0 or self.rows != self.length - 1:
            raise DrafterStateError("no prediction yet: commit at least two tokens with the target's features")

    def _append(self, feats: torch.Tensor) -> None:
        if feats.shape[0]:
            self._append_rows(feats)
            self.rows += feats.shape[0]

    def _keep(self, rows: int) -> None:
        if rows < self.rows:
            self._truncate_rows(rows)
            self.rows = rows

    @abc.abstractmethod
    def _append_rows(self, feats: torch.Tensor) -> None:
        """feats: [k, E] the features of positions rows..rows+k-1 (k >= 1)."""

    @abc.abstractmethod
    def _truncate_rows(self, keep: int) -> None:
        """Keep rows 0..keep-1 (keep < rows)."""

    @abc.abstractmethod
    def _predicted_row(self) -> torch.Tensor:
        """[1, E] the runtime's own prediction of the feature of position ``rows``."""
