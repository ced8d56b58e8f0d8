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
from .data import read_samples
from .features import StoredSequence, target_features, tokenize_sample

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
        from edgespec.shared.models import load_model

        self.path = Path(data_dir)
        rows = read_samples(self.path / "samples.jsonl")
        if not rows:
            raise FileNotFoundError(f"no samples in {data_dir}/samples.jsonl: run `edgespec train data` first")
        self.loaded = load_model(target, device=device, dtype=dtype)
        self.tli_depths = tuple(tli_depths)
        self.shape = target_shape(self.loaded.model)
        self.meta = {"target": target, "fingerprint": self.loaded.fingerprint, "shape": self.shape.__dict__,
                     "format": "online", "tli_depths": list(tli_depths), "max_len": max_len}
        self._rows = []
        for row in rows:
            ids, mask = tokenize_sample(self.loaded.tokenizer, row, max_len)
            if len(ids) >= 4:
                self._rows.append((row, ids, mask))
        self.files = [RowRef(i, r["split"], len(ids)) for i, (r, ids, _) in enumerate(self._rows)]
        log.info("features from %s during training: %d sequences", target, len(self.files))

    def split(self, name: str) -> list[RowRef]:
        return [f for f in self.files if f.split == name]

    def tokens(self, name: str) -> int:
        return sum(f.tokens for f in self.split(name))

    def load(self, ref: RowRef, names: tuple[str, ...] = ("hidden", "kv")) -> StoredSequence:
        row, ids, mask = self._rows[ref.index]
        tokens, loss_mask = torch.tensor(ids), torch.tensor(mask, dtype=torch.bool)
        if not names:
            return StoredSequence(row["id"], row["split"], tokens, loss_mask, None, None, {})
        depths = tuple(d for d in self.tli_depths if f"act{d}" in names)
        feats = target_features(self.loaded.model, ids, depths)
        return StoredSequence(row["id"], row["split"], tokens, loss_mask,
                              feats["hidden"] if "hidden" in names else None, feats["kv"] if "kv" in names else None,
                              {d: feats[f"act{d}"] for d in depths})
