"""Beagle drafting state: the states' memory over committed tokens, draft trees, offline mode.

Same use as ``EagleDrafter`` (``parts`` = the target's frozen embedding / norm / LM head):

    d = BeagleDrafter(head, parts)
    d.commit(prompt_ids + [first], hidden)     # hidden: [n - 1, E], states lag one token
    lp = d.root_logprobs()                      # [V'] next token after the last committed one
    lps = d.expand(tokens, parents)             # [k, V'] after each new draft node
    d.commit(accepted + [bonus], hidden_new)    # states of the newly covered tokens
    d.commit([tok], None)                       # offline: the drafter's own predicted state stands in
    d.rollback(n)                               # keep the first n committed tokens
    d.attach_router(router)                     # optional: CORAL's LM-head router (router.py); None detaches

Memory layout while drafting: [committed states 0..rows-1 ; the root's predicted state at
position rows ; one predicted state per draft node at position rows + depth]. A node's query
(its token at position rows + depth) sees the committed states, the root's and its strict
ancestors' predicted states: never its own (the diagonal).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .beagle import BeagleHead, Memory, cat_memory, take_memory
from .draft_area import DraftArea
from .eagle_drafter import DrafterStateError
from .target_parts import TargetParts


class BeagleDrafter:
    def __init__(self, head: BeagleHead, parts: TargetParts):
        self.head, self.parts = head.eval(), parts
        self.routed = None  # router.RoutedHead: the LM head restricted to a router's groups, when attached
        self.reset()

    def attach_router(self, router) -> None:
        """Draft with a router's chosen groups of the LM head (an LMHeadRouter or RoutedHead; None:
        the full head again)."""
        from .router import routed_head_for

        self.routed = routed_head_for(router, self.parts)

    def reset(self) -> None:
        self.tokens: list[int] = []
        self.memory: Memory | None = None  # states of positions 0..rows-1 (the target's or, offline, predicted)
        self.rows = 0
        self._root: torch.Tensor | None = None  # [1, E] predicted state of the last committed position
        self.clear_draft()

    @property
    def length(self) -> int:
        """Committed tokens."""
        return len(self.tokens)

    @property
    def covered(self) -> int:
        """Committed positions whose state is in the memory (all but the last once in step)."""
        return self.rows

    @torch.no_grad()
    def commit(self, tokens: Sequence[int], hidden: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
               features_from: int | None = None) -> None:
        """Append committed tokens. ``hidden``: the target's states [k, E] of the tokens that become
        covered (one behind the committed text), or None to use the drafter's own predictions (offline).
        ``features_from``: the position of hidden's first row when it replaces predicted rows (a resume).
        A mapping of features by name (the wire's) is read for its "hidden"."""
        if isinstance(hidden, Mapping):
            if "hidden" not in hidden:
                raise DrafterStateError(f"Beagle needs the 'hidden' feature; got {sorted(hidden)}")
            hidden = hidden["hidden"]
        self.clear_draft()
        self.tokens += self.parts.check_tokens(tokens).tolist()
        self._root = None
        if hidden is not None and features_from is not None:
            if not 0 <= features_from <= self.rows:
                raise DrafterStateError(f"features from position {features_from} would leave a gap: the drafter "
                                        f"has states of positions 0..{self.rows - 1}")
            self._truncate_rows(features_from)
        missing = self.length - 1 - self.rows
        if hidden is not None:
            if hidden.shape[0] != missing:
                raise DrafterStateError(f"expected states of {missing} tokens (all committed but the last not "
                                        f"yet covered), got {hidden.shape[0]}")
            self._append_states(hidden.to(self.head.dtype))
            return
        for _ in range(missing):
            if self.rows == 0:
                raise DrafterStateError("a Beagle drafter needs the target's state of at least one token before "
                                        "it can go on from its own predictions")
            self._append_states(self._predict_at(self.rows))

    def _predict_at(self, position: int) -> torch.Tensor:
        """[1, E] the state at ``position`` predicted from the committed memory before it."""
        tok = torch.tensor([self.tokens[position]])
        mask = torch.ones(1, position, dtype=torch.bool)
        return self.head(self.parts.embed(tok), torch.tensor([position]), take_memory(self.memory, slice(0, position)),
                         mask)

    def _append_states(self, states: torch.Tensor) -> None:
        # states: [k, E] of positions rows..rows+k-1
        k = states.shape[0]
        if k == 0:
            return
        new = self.head.memory(states, torch.arange(self.rows, self.rows + k))
        self.memory = cat_memory(self.memory, new)
        self.rows += k

    def _root_state(self) -> torch.Tensor:
        if self.rows == 0 or self.rows != self.length - 1:
            raise DrafterStateError("no prediction yet: commit at least two tokens with the target's states")
        if self._root is None:
            self._root = self._predict_at(self.rows)
        return self._root

    @torch.no_grad()
    def root_logprobs(self) -> torch.Tensor:
        """[V'] log-probabilities of the token after the last committed one."""
        return self._logprobs(self._root_state())[0]

    @torch.no_grad()
    def expand(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Add draft nodes (target ids; parent -1 = the root, else an earlier node); returns [k, V']."""
        if len(tokens) != len(parents):
            raise DrafterStateError(f"{len(tokens)} draft tokens but {len(parents)} parents")
        root = self._root_state()
        ids = self.parts.check_tokens(tokens)
        k0 = len(self.area)
        if any(p >= k0 for p in parents):  # chains inside one call: a node's parent must be in memory first
            return torch.cat([self.expand([t], [p]) for t, p in zip(tokens, parents)])
        if self.draft_memory is None:  # the root's predicted state: every draft node sees it
            self.draft_memory = self.head.memory(root, torch.tensor([self.rows]))
        fixed = self.rows + 1
        vis, depths = self.area.add(parents, fixed)
        mask = vis[:, :fixed + k0]  # committed + root + earlier nodes: ancestors only (a node is never its own)
        pos = torch.tensor([self.rows + d for d in depths])
        pred = self.head(self.parts.embed(ids), pos, cat_memory(self.memory, self.draft_memory), mask)
        self.draft_memory = cat_memory(self.draft_memory, self.head.memory(pred, pos))
        return self._logprobs(pred)

    def clear_draft(self) -> None:
        self.area = DraftArea()
        self.draft_memory: Memory | None = None

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` committed tokens (and the states of their positions)."""
        if not 0 <= length <= self.length:
            raise DrafterStateError(f"cannot roll back to {length} tokens: {self.length} are committed")
        self.clear_draft()
        self.tokens = self.tokens[:length]
        self._root = None
        self._truncate_rows(max(0, min(self.rows, length - 1)))

    def _truncate_rows(self, keep: int) -> None:
        self._root = None
        if self.memory is not None:
            self.memory = take_memory(self.memory, slice(0, keep)) if keep else None
        self.rows = keep

    def _logprobs(self, states: torch.Tensor) -> torch.Tensor:
        if self.routed is not None:
            return self.routed.logprobs(states)
        return torch.log_softmax(self.parts.logits(states).float(), dim=-1)
