"""EAGLE drafting: the head's cache over committed tokens and draft nodes (``runtime`` has the use).

Features are the target's last hidden states (``wire.HIDDEN``, [k, E]). Row r of the head's cache is
(f_r, c_{r+1}) at position r and predicts f_{r+1}; offline that prediction stands in for the
target's feature of the next row.
"""
from __future__ import annotations

import torch

from edgespec.shared import wire
from edgespec.shared.drafters.blocks import KV, causal_mask
from edgespec.shared.drafters.eagle.model import EagleHead
from edgespec.shared.drafters.target_parts import TargetParts
from edgespec.shared.tree import ROOT

from .runtime import RowsRuntime


def _cat(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else torch.cat([a, b])


class EagleRuntime(RowsRuntime):
    name = "EAGLE"
    feature = wire.HIDDEN
    batch_in_call_parents = False  # a node's input is its parent's predicted feature

    def __init__(self, head: EagleHead, parts: TargetParts):
        self.head = head.eval()
        super().__init__(parts)

    def reset(self) -> None:
        super().reset()
        self.kv: KV | None = None  # committed rows: row r = (f_r, c_{r+1}) at position r
        self.preds: torch.Tensor | None = None  # [rows, E]: row r's predicted feature of position r+1

    def clear_draft(self) -> None:
        super().clear_draft()
        self.draft_kv: KV | None = None
        self.draft_preds: torch.Tensor | None = None  # [k, E]

    def _append_rows(self, feats: torch.Tensor) -> None:
        r0, k = self.rows, feats.shape[0]
        toks = torch.tensor(self.tokens[r0 + 1:r0 + 1 + k])
        pos = torch.arange(r0, r0 + k)
        mask = torch.cat([torch.ones(k, r0, dtype=torch.bool), causal_mask(k)], 1)
        pred, kv = self.head(self.parts.embed(toks), feats.to(self.head.fc.weight.dtype), pos, mask, self.kv)
        self.kv = kv if self.kv is None else self.kv.cat(kv)
        self.preds = _cat(self.preds, pred)

    def _truncate_rows(self, keep: int) -> None:
        self.kv = self.kv.take(slice(0, keep)) if keep else None
        self.preds = self.preds[:keep] if keep else None

    def _predicted_row(self) -> torch.Tensor:
        return self.preds[-1:]

    def _root_logprobs(self) -> torch.Tensor:
        return self._logprobs(self.preds[-1:])[0]

    def _fixed_rows(self) -> int:
        return self.rows

    def _expand(self, ids: torch.Tensor, parents: list[int], depths: list[int], vis: torch.Tensor) -> torch.Tensor:
        feats = torch.stack([self.preds[-1] if p == ROOT else self.draft_preds[p] for p in parents])
        pos = torch.tensor([self.rows - 1 + d for d in depths])
        past = self.kv if self.draft_kv is None else self.kv.cat(self.draft_kv)
        pred, kv = self.head(self.parts.embed(ids), feats, pos, vis, past)
        self.draft_kv = kv if self.draft_kv is None else self.draft_kv.cat(kv)
        self.draft_preds = _cat(self.draft_preds, pred)
        return self._logprobs(pred)
