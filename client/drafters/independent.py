"""A small LM of the target's tokenizer as drafter, with its own KV cache.

The cache follows the committed text: before each proposal the drafter finds
the longest prefix it already holds, crops the rest and feeds what is new, so
verification results, resumes and rollbacks all resync the same way. Trees are
EAGLE-2 trees (``tree_builder``); the frontier nodes of each depth go through
the model in one forward pass with a tree attention mask, their KV appended
after the committed tokens and cropped away once the tree is built. Offline it
is a plain greedy LM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from edgespec.shared.tree import DraftTree

from .base import Drafter, DraftRequest
from .tree_builder import Candidates, TreeShape, build_tree


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def crop_to(cache, length: int) -> None:
    """Keep the first `length` positions of a DynamicCache (transformers 5 crops by a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def frontier_mask(frontier: list[int], cands: Candidates, slot: dict[int, int], committed_len: int,
                  past_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, k, past_len + k] for feeding frontier candidates after the cache.

    The cache holds the committed tokens (positions < committed_len, all visible)
    then earlier fed candidates at ``slot[c]``; a frontier node sees the
    committed tokens, its fed ancestors and itself.
    """
    k = len(frontier)
    allowed = torch.zeros(k, past_len + k, dtype=torch.bool)
    allowed[:, :committed_len] = True
    for row, c in enumerate(frontier):
        for a in cands.ancestors(c)[:-1]:
            allowed[row, slot[a]] = True
        allowed[row, past_len + row] = True
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


@dataclass(frozen=True)
class IndependentConfig:
    """Settings of the independent drafter."""

    tree: TreeShape = TreeShape()  # EAGLE-2 tree shape


class IndependentDrafter(Drafter):
    name = "independent"
    can_generate_offline = True

    def __init__(self, model: torch.nn.Module, config: IndependentConfig = IndependentConfig()):
        from transformers import DynamicCache

        self.model = model.eval()
        self.config = config
        self._cache_type = DynamicCache
        self._cache = DynamicCache()
        self._fed: list[int] = []  # ids whose KV is in the cache, in order

    @classmethod
    def from_pretrained(cls, name_or_path: str, config: IndependentConfig = IndependentConfig(),
                        device: str | None = "cpu", dtype: str | torch.dtype | None = None) -> "IndependentDrafter":
        from edgespec.shared.models import load_model

        return cls(load_model(name_or_path, device=device, dtype=dtype).model, config)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @torch.inference_mode()
    def _forward(self, ids: list[int], positions: list[int], mask: torch.Tensor | None,
                 last_only: bool = False) -> torch.Tensor:
        """Logits [len(ids), V] (or [1, V] with last_only) of ids fed after the cache (which grows by len(ids))."""
        # last_only: the LM head over a 150k vocabulary costs as much as the model body per row, so rows
        # nobody reads are skipped.
        out = self.model(input_ids=torch.tensor([ids], device=self.device),
                         position_ids=torch.tensor([positions], device=self.device),
                         attention_mask=None if mask is None else mask.to(self.device),
                         past_key_values=self._cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        return out.logits[0].float()

    def _sync(self, committed: Sequence[int]) -> torch.Tensor:
        """Make the cache hold exactly `committed`; return the logits after its last token [V]."""
        keep = min(common_prefix(self._fed, committed), len(committed) - 1)
        crop_to(self._cache, keep)
        new = list(committed[keep:])
        logits = self._forward(new, list(range(keep, len(committed))), None, last_only=True)
        self._fed = list(committed)
        return logits[-1]

    def propose(self, request: DraftRequest) -> DraftTree:
        committed = request.committed
        root_logprobs = torch.log_softmax(self._sync(committed), dim=-1)
        n = len(committed)
        slot: dict[int, int] = {}  # candidate index -> cache position

        def expand(frontier: list[int], cands: Candidates) -> torch.Tensor:
            past = self._cache.get_seq_length()
            mask = frontier_mask(frontier, cands, slot, n, past, self.dtype)
            for row, c in enumerate(frontier):
                slot[c] = past + row
            logits = self._forward([cands.tokens[c] for c in frontier],
                                   [n - 1 + cands.depths[c] for c in frontier], mask)
            return torch.log_softmax(logits, dim=-1)

        try:
            tree, _ = build_tree(root_logprobs, expand, self.config.tree, request.max_nodes, request.max_depth)
        finally:
            crop_to(self._cache, n)  # drop the tree's KV: only committed tokens stay
        return tree

    def generate_offline(self, committed: Sequence[int]) -> int:
        return int(self._sync(committed).argmax())

    def close(self) -> None:
        self._cache = self._cache_type()
        self._fed = []
