"""The chi-square test the sampling tests share: a sampled law against the target's."""
from __future__ import annotations

import math

import torch


def chi_square_critical(dof: int, z: float = 3.72) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at about p = 1e-4."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """The statistic of `counts` against `probs` and its degrees of freedom; a zero-probability token fails."""
    n = counts.sum().item()
    mask = probs > 0
    assert counts[~mask].sum() == 0, "a token of probability 0 was produced"
    expected = probs[mask] * n
    return float(((counts[mask] - expected) ** 2 / expected).sum()), int(mask.sum()) - 1
