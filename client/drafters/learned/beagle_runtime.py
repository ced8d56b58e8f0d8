"""Beagle drafting: the states' memory over committed tokens and draft nodes (``runtime`` has the use).

Features are the target's states (``wire.HIDDEN``, [k, E]); offline the drafter's own predicted
state of a position stands in for the target's.

Memory layout while drafting: [committed states 0..rows-1 ; the root's predicted state at
position rows ; one predicted state per draft node at position rows + depth]. A node's query
(its token at position rows + depth) sees the committed states, the root's and its strict
ancestors' predicted states: never its own (the diagonal).
"""
from __future__ import annotations

import torch

from edgespec.shared import wire
from edgespec.shared.drafters.beagle.model import BeagleHead, Memory, cat_memory, take_memory
from edgespec.shared.drafters.target_parts import TargetParts

from .runtime import RowsRuntime


class BeagleRuntime(RowsRuntime):
    name = "Beagle"
    feature = wire.HIDDEN
    batch_in_call_parents = False  # a node's parent's predicted state must be in the memory first

    def __init__(self, head: BeagleHead, parts: TargetParts):
        self.head = head.eval()
        super().__init__(parts)

    def reset(self) -> None:
        super().reset()
        self.memory: Memory | None = None  # states of positions 0..rows-1 (the target's or, offline, predicted)
        self._root: torch.Tensor | None = None  # [1, E] predicted state of the last committed position

    def clear_draft(self) -> None:
        super().clear_draft()
        self.draft_memory: Memory | None = None

    @property
    def covered(self) -> int:
        """Committed positions whose state is in the memory (all but the last once in step)."""
        return self.rows

    def _predict_at(self, position: int) -> torch.Tensor:
        """[1, E] the state at ``position`` predicted from the committed memory before it."""
        tok = torch.tensor([self.tokens[position]])
        return self.head(self.parts.embed(tok), torch.tensor([position]), take_memory(self.memory, slice(0, position)),
                         torch.ones(1, position, dtype=torch.bool))

    def _append_rows(self, feats: torch.Tensor) -> None:
        new = self.head.memory(feats.to(self.head.dtype), torch.arange(self.rows, self.rows + feats.shape[0]))
        self.memory = cat_memory(self.memory, new)
        self._root = None

    def _truncate_rows(self, keep: int) -> None:
        self.memory = take_memory(self.memory, slice(0, keep)) if keep else None
        self._root = None

    def _predicted_row(self) -> torch.Tensor:
        return self._predict_at(self.rows)

    def _root_state(self) -> torch.Tensor:
        if self._root is None:
            self._root = self._predict_at(self.rows)
        return self._root

    def _root_logprobs(self) -> torch.Tensor:
        return self._logprobs(self._root_state())[0]

    def _fixed_rows(self) -> int:
        return self.rows + 1  # the committed states and the root's predicted one

    def _expand(self, ids: torch.Tensor, parents: list[int], depths: list[int], vis: torch.Tensor) -> torch.Tensor:
        if self.draft_memory is None:  # the root's predicted state: every draft node sees it
            self.draft_memory = self.head.memory(self._root_state(), torch.tensor([self.rows]))
        earlier = vis.shape[1] - len(ids)  # committed + root + earlier nodes: ancestors only, never itself
        pos = torch.tensor([self.rows + d for d in depths])
        pred = self.head(self.parts.embed(ids), pos, cat_memory(self.memory, self.draft_memory), vis[:, :earlier])
        self.draft_memory = cat_memory(self.draft_memory, self.head.memory(pred, pos))
        return self._logprobs(pred)
