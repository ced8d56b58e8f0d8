"""Loss terms and acceptance statistics, as pure functions of tensors.

Weights ``w`` are per-row floats (0 = the row does not count); every loss is the
weighted mean over rows, so sequences of any length mix in one batch by summing
numerators and denominators (``Term``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Term:
    """A weighted sum over rows and its weight total: batch-level means add up correctly."""

    total: torch.Tensor
    weight: torch.Tensor

    def mean(self) -> torch.Tensor:
        return self.total / self.weight.clamp_min(1e-9)

    def __add__(self, other: "Term") -> "Term":
        return Term(self.total + other.total, self.weight + other.weight)

    def __radd__(self, other: int) -> "Term":  # sum(terms) starts from 0
        return self if other == 0 else NotImplemented


def smooth_l1(pred: torch.Tensor, target: torch.Tensor, w: torch.Tensor) -> Term:
    """SmoothL1 on activations, mean over channels. pred, target: [T, E]; w: [T]."""
    per_row = F.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1)
    return Term((per_row * w).sum(), w.sum())


def soft_cross_entropy(draft_logits: torch.Tensor, target_logits: torch.Tensor, w: torch.Tensor) -> Term:
    """EAGLE's classification term: cross-entropy of the drafter against the target's distribution."""
    p = torch.softmax(target_logits.float(), -1)
    per_row = -(p * torch.log_softmax(draft_logits.float(), -1)).sum(-1)
    return Term((per_row * w).sum(), w.sum())


def forward_kl(draft_logits: torch.Tensor, target_logits: torch.Tensor, w: torch.Tensor) -> Term:
    """MoA's KL(target || drafter) per row."""
    logp_t = torch.log_softmax(target_logits.float(), -1)
    logp_d = torch.log_softmax(draft_logits.float(), -1)
    per_row = (logp_t.exp() * (logp_t - logp_d)).sum(-1)
    return Term((per_row * w).sum(), w.sum())


def chain_accepted(matches: torch.Tensor) -> torch.Tensor:
    """matches: bool [S, K] (start s, draft step k matches the target) -> accepted length [S]:
    drafting stops at the first mismatch."""
    return matches.long().cumprod(dim=1).sum(dim=1)


@dataclass
class Acceptance:
    """Per-position acceptance on a validation split: ``at_least[k]`` drafts of chains whose
    first k+1 tokens were all accepted; rates divide by ``chains``."""

    chains: int
    at_least: list[int]

    def __add__(self, other: "Acceptance") -> "Acceptance":
        if not self.at_least:
            return other
        return Acceptance(self.chains + other.chains, [a + b for a, b in zip(self.at_least, other.at_least)])

    @staticmethod
    def of(accepted: torch.Tensor, depth: int) -> "Acceptance":
        return Acceptance(int(accepted.numel()), [int((accepted >= k).sum()) for k in range(1, depth + 1)])

    def rates(self) -> list[float]:
        return [a / max(1, self.chains) for a in self.at_least]

    def mean_length(self) -> float:
        """Mean accepted draft tokens per chain (add 1 for the bonus token to get tau)."""
        return sum(self.at_least) / max(1, self.chains)
