"""Features straight from the target during training, instead of a stored copy.

On a GPU the target's forward over a window costs less than reading its features back (all
layers' K/V are ~14 KB a token for the 1.5B in int8), so when the target fits beside the
drafter, ``edgespec train fit --features-from target --data DIR`` holds it and runs it on
each sequence it trains on. ``TargetFeatures`` reads like a ``FeatureStore``: the same splits
(from the data rows), ``load`` runs the target instead of decoding a file, and the trainer
keeps nothing in memory (``cache = False``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from edgespec.shared.drafters.target_parts import target_shape
from .extraction import tokenized_rows
from .features import StoredSequence, data_and_target, store_meta, target_features

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowRef:
    """Row ``index`` of the data set."""

    index: int
    split: str
    tokens: int


class TargetFeatures:
    cache = False  # recomputed on every use: holding them would be the store this avoids

    def __init__(self, target: str, data_dir: str | Path, max_len: int = 1024, tli_depths: tuple[int, ...] = (0, 1, 3),
                 device: str | None = None, dtype: str | None = None):
        self.path = Path(data_dir)
        rows, self.loaded = data_and_target(target, data_dir, device, dtype)
        self.tli_depths = tuple(tli_depths)
        self.shape = target_shape(self.loaded.model)
        self.meta = store_meta(target, self.loaded, tli_depths, max_len, format="online")
        self._seqs = tokenized_rows(self.loaded.tokenizer, rows, max_len)
        self.files = [RowRef(i, s.split, len(s.ids)) for i, s in enumerate(self._seqs)]
        log.info("features from %s during training: %d sequences", target, len(self.files))

    def split(self, name: str) -> list[RowRef]:
        return [f for f in self.files if f.split == name]

    def tokens(self, name: str) -> int:
        return sum(f.tokens for f in self.split(name))

    def load(self, ref: RowRef, names: tuple[str, ...] = ("hidden", "kv")) -> StoredSequence:
        s = self._seqs[ref.index]
        tokens, loss_mask = torch.tensor(s.ids), torch.tensor(s.mask, dtype=torch.bool)
        if not names:
            return StoredSequence(s.id, s.split, tokens, loss_mask, None, None, {})
        depths = tuple(d for d in self.tli_depths if f"act{d}" in names)
        # The target runs under inference mode (features.batch_features): its outputs are inference
        # tensors, which autograd refuses to save for backward, and EAGLE's hidden state is both an
        # input of the head and its loss target. A clone made out here is an ordinary tensor.
        feats = {k: v.clone() for k, v in target_features(self.loaded.model, s.ids, depths).items()}
        return StoredSequence(s.id, s.split, tokens, loss_mask,
                              feats["hidden"] if "hidden" in names else None, feats["kv"] if "kv" in names else None,
                              {d: feats[f"act{d}"] for d in depths})
