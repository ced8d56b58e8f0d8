"""What the trainer needs from a drafter kind: a recipe.

A recipe turns one stored sequence into named outputs (``forward``), and a list of
``LossTerm`` turns outputs into the loss. New recipes (HASS, CORAL, Beagle) add
outputs (e.g. more unrolled steps) and terms without touching the trainer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from .features import StoredSequence
from .losses import Acceptance, Term

Outputs = dict[str, object]


@dataclass
class LossTerm:
    name: str  # logged as loss/<name>
    weight: float  # multiplies the term's mean in the total loss
    fn: Callable[[Outputs], Term]  # outputs of one sequence -> weighted sum over its rows


class Recipe(Protocol):
    kind: str
    feature_names: tuple[str, ...]  # what to decode from the feature store
    terms: list[LossTerm]

    def trainable(self) -> dict[str, nn.Module]:
        """Named modules whose parameters the optimizer trains (and checkpoints store)."""

    def forward(self, seq: StoredSequence, start: int, end: int, gen: torch.Generator) -> Outputs:
        """Training outputs over the window [start, end) of a sequence."""

    def acceptance(self, seq: StoredSequence, depth: int) -> Acceptance:
        """Per-position acceptance of drafted chains on one validation sequence."""

    def save_drafter(self, out_dir: Path) -> list[Path]:
        """Write the drafter's shippable files; returns their paths."""


def sequence_loss(recipe: Recipe, outputs: Outputs) -> dict[str, Term]:
    return {t.name: t.fn(outputs) for t in recipe.terms}


def total_loss(recipe: Recipe, terms: dict[str, Term]) -> torch.Tensor:
    return sum(t.weight * terms[t.name].mean() for t in recipe.terms)
