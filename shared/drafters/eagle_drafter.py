"""EAGLE drafting state: the head's cache over committed tokens, draft trees, offline mode.

Use (``parts`` = the target's frozen embedding / norm / LM head):

    d = EagleDrafter(head, parts)
    d.commit(prompt_ids + [first], hidden)     # hidden: [n - 1, E], features lag one token
    lp = d.root_logprobs()                      # [V'] next token after the last committed one
    lps = d.expand(tokens, parents)             # [k, V'] after each new draft node
    d.commit(accepted + [bonus], hidden_new)    # new rows = features of the newly covered tokens
    d.commit([tok], None)                       # offline: the head's own predicted feature stands in
    d.rollback(n)                               # keep the first n committed tokens
    d.attach_router(router)                     # optional: CORAL's LM-head router (router.py) computes
                                                # only its chosen vocabulary groups; None detaches it

Draft-vocabulary indices map to target ids with ``parts.to_target_ids``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..errors import EdgespecError
from .blocks import KV
from .draft_area import DraftArea
from .eagle import EagleHead
from .masks import causal_mask
from .router import LMHeadRouter, RoutedHead, routed_head_for
from .target_parts import TargetParts


class DrafterStateError(EdgespecError, ValueError):
    """A drafter asked to do something its state does not allow (features of the wrong length,
    drafting before anything is committed, rolling back past the start)."""

    grpc_code = "FAILED_PRECONDITION"


class EagleDrafter:
    def __init__(self, head: EagleHead, parts: TargetParts):
        self.head, self.parts = head.eval(), parts
        self.routed: RoutedHead | None = None  # the LM head restricted to a router's groups, when attached
        self.reset()

    def attach_router(self, router: LMHeadRouter | RoutedHead | None) -> None:
        """Draft with a router's chosen groups of the LM head (None: the full head again).
        A RoutedHead already made for these parts is reused (no second copy of the head)."""
        self.routed = routed_head_for(router, self.parts)

    def reset(self) -> None:
        self.tokens: list[int] = []
        self.kv: KV | None = None  # committed rows: row r = (f_r, c_{r+1}) at position r
        self.preds: torch.Tensor | None = None  # [rows, E]: row r's predicted feature of position r+1
        self.area = DraftArea()
        self.draft_kv: KV | None = None
        self.draft_preds: torch.Tensor | None = None  # [k, E]

    @property
    def length(self) -> int:
        """Committed tokens."""
        return len(self.tokens)

    @property
    def rows(self) -> int:
        return 0 if self.kv is None else self.kv.length

    @torch.no_grad()
    def commit(self, tokens: Sequence[int], hidden: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
               features_from: int | None = None) -> None:
        """Append committed tokens. ``hidden``: the target's features [k, E] of the tokens that
        become covered (one behind: after this call features cover all but the last committed
        token), or None to use the head's own predictions (offline mode). ``features_from``: the
        position of hidden's first row when it replaces rows made from predictions (a resume).
        A mapping of features by name (the wire's) is read for its "hidden"."""
        if isinstance(hidden, Mapping):
            if "hidden" not in hidden:
                raise DrafterStateError(f"EAGLE needs the 'hidden' feature; got {sorted(hidden)}")
            hidden = hidden["hidden"]
        self.clear_draft()
        self.tokens += self.parts.check_tokens(tokens).tolist()
        if hidden is not None and features_from is not None:
            if not 0 <= features_from <= self.rows:
                raise DrafterStateError(f"features from position {features_from} would leave a gap: the head "
                                        f"has rows for positions 0..{self.rows - 1}")
            self._truncate_rows(features_from)
        missing = self.length - 1 - self.rows
        if hidden is not None:
            if hidden.shape[0] != missing:
                raise DrafterStateError(f"expected features of {missing} tokens (all committed but the last "
                                        f"not yet covered), got {hidden.shape[0]}")
            self._append_rows(hidden.to(self.head.fc.weight.dtype))
            return
        for _ in range(missing):
            if self.preds is None:
                raise DrafterStateError("an EAGLE drafter needs the target's features of at least one token "
                                        "before it can go on from its own predictions")
            self._append_rows(self.preds[-1:])

    def _append_rows(self, feats: torch.Tensor) -> None:
        # feats: [k, E] features f_r of the rows r = rows..rows+k-1, each paired with token c_{r+1}
        r0, k = self.rows, feats.shape[0]
        if k == 0:
            return
        toks = torch.tensor(self.tokens[r0 + 1:r0 + 1 + k])
        pos = torch.arange(r0, r0 + k)
        mask = torch.cat([torch.ones(k, r0, dtype=torch.bool), causal_mask(k)], 1)
        pred, kv = self.head(self.parts.embed(toks), feats, pos, mask, self.kv)
        self.kv = kv if self.kv is None else self.kv.cat(kv)
        self.preds = pred if self.preds is None else torch.cat([self.preds, pred])

    def root_logprobs(self) -> torch.Tensor:
        """[V'] log-probabilities of the token after the last committed one."""
        if self.preds is None or self.rows != self.length - 1:
            raise DrafterStateError("no prediction yet: commit at least two tokens with the target's features")
        return self._logprobs(self.preds[-1:])[0]

    @torch.no_grad()
    def expand(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Add draft nodes (target ids; parent -1 = the root, else an earlier node); returns [k, V']."""
        if len(tokens) != len(parents):
            raise DrafterStateError(f"{len(tokens)} draft tokens but {len(parents)} parents")
        self.root_logprobs()  # raises when there is nothing to draft from
        ids = self.parts.check_tokens(tokens)
        k0 = len(self.area)
        vis, depths = self.area.add(parents, self.rows)
        feats = []
        for r, p in enumerate(parents):
            if p < 0:
                feats.append(self.preds[-1])
            elif p < k0:
                feats.append(self.draft_preds[p])
            else:
                feats.append(None)  # a parent added in this same call: resolved row by row below
        if any(f is None for f in feats):  # chains inside one call: one row at a time
            self.area.parents, self.area.depths = self.area.parents[:k0], self.area.depths[:k0]
            self.area.vis = None if k0 == 0 else self.area.vis[:k0, :self.rows + k0]
            return torch.cat([self.expand([t], [p]) for t, p in zip(tokens, parents)])
        pos = torch.tensor([self.rows - 1 + d for d in depths])
        past = self.kv if self.draft_kv is None else self.kv.cat(self.draft_kv)
        pred, kv = self.head(self.parts.embed(ids), torch.stack(feats), pos, vis, past)
        self.draft_kv = kv if self.draft_kv is None else self.draft_kv.cat(kv)
        self.draft_preds = pred if self.draft_preds is None else torch.cat([self.draft_preds, pred])
        return self._logprobs(pred)

    def clear_draft(self) -> None:
        self.area.clear()
        self.draft_kv = self.draft_preds = None

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` committed tokens (and the rows their features made)."""
        if not 0 <= length <= self.length:
            raise DrafterStateError(f"cannot roll back to {length} tokens: {self.length} are committed")
        self.clear_draft()
        self.tokens = self.tokens[:length]
        self._truncate_rows(max(0, min(self.rows, length - 1)))

    def _truncate_rows(self, keep: int) -> None:
        if self.kv is not None:
            self.kv = self.kv.take(slice(0, keep)) if keep else None
            self.preds = self.preds[:keep] if keep else None

    def _logprobs(self, feats: torch.Tensor) -> torch.Tensor:
        if self.routed is not None:
            return self.routed.logprobs(feats)
        return torch.log_softmax(self.parts.logits(feats).float(), dim=-1)
