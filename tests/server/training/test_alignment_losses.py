"""The alignment recipes' loss terms on hand-computed examples: top-K distillation (HASS),
InfoNCE with cosine similarity and cross-step alignment (CORAL)."""
from __future__ import annotations

import math

import pytest
import torch

from edgespec.server.training.alignment_losses import cross_step_alignment, info_nce, topk_distillation


def logits_of(probs):
    return torch.tensor(probs).log()


def test_topk_distillation_covers_only_the_targets_k_most_probable_tokens():
    target = logits_of([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    draft = logits_of([[0.25, 0.25, 0.5], [0.5, 0.25, 0.25]])
    w = torch.tensor([1.0, 1.0])
    # row 0, K = 2: the target's top 2 are tokens 0, 1: -(0.5 ln 0.25 + 0.3 ln 0.25) = 0.8 ln 4
    t = topk_distillation(draft[:1], target[:1], w[:1], k=2)
    assert float(t.total) == pytest.approx(0.8 * math.log(4), rel=1e-6)
    assert float(t.weight) == 1.0
    one = topk_distillation(draft, target, w, k=1)  # -(0.5 ln 0.25) and -(0.8 ln 0.25)
    assert float(one.mean()) == pytest.approx((0.5 + 0.8) * math.log(4) / 2, rel=1e-6)


def test_topk_distillation_with_k_covering_the_vocabulary_is_the_soft_cross_entropy():
    from edgespec.server.training.losses import soft_cross_entropy

    g = torch.Generator().manual_seed(0)
    draft, target = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    w = torch.tensor([1.0, 0.0, 2.0, 1.0])
    full = soft_cross_entropy(draft, target, w)
    assert float(topk_distillation(draft, target, w, k=7).mean()) == pytest.approx(float(full.mean()), rel=1e-5)
    assert float(topk_distillation(draft, target, w, k=100).mean()) == pytest.approx(float(full.mean()), rel=1e-5)
    assert float(topk_distillation(draft, target, w, k=3).mean()) < float(full.mean())  # a part of the same sum


def test_topk_distillation_weights_rows_and_refuses_k_zero():
    target, draft = logits_of([[0.5, 0.5]]), logits_of([[0.5, 0.5]])
    t = topk_distillation(draft.repeat(2, 1), target.repeat(2, 1), torch.tensor([0.0, 3.0]), k=1)
    assert float(t.total) == pytest.approx(3 * 0.5 * math.log(2), rel=1e-6) and float(t.weight) == 3.0
    with pytest.raises(ValueError, match="K >= 1"):
        topk_distillation(draft, target, torch.ones(1), k=0)


def test_info_nce_by_hand():
    q = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    k = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    t = 0.5
    # cosines: q0.k0 = 1, q0.k1 = 1/sqrt2; q1.k0 = 0, q1.k1 = 1/sqrt2 (lengths do not count)
    c = 1 / math.sqrt(2)
    row0 = -math.log(math.exp(1 / t) / (math.exp(1 / t) + math.exp(c / t)))
    row1 = -math.log(math.exp(c / t) / (math.exp(0.0) + math.exp(c / t)))
    out = info_nce(q, k, torch.tensor([1.0, 2.0]), temperature=t)
    assert float(out.total) == pytest.approx(row0 + 2 * row1, rel=1e-6)
    assert float(out.weight) == 3.0


def test_info_nce_is_low_for_matching_positions_and_refuses_bad_input():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 8, generator=g)
    w = torch.ones(16)
    aligned = info_nce(x, 2 * x, w, 0.1).mean()
    shuffled = info_nce(x, x.roll(1, 0), w, 0.1).mean()
    assert float(aligned) < 0.05 < 1.0 < float(shuffled)
    with pytest.raises(ValueError, match="temperature"):
        info_nce(x, x, w, 0.0)
    with pytest.raises(ValueError, match="pair row by row"):
        info_nce(x, x[:3], w, 0.1)


def test_cross_step_alignment_sums_every_pair_of_steps():
    g = torch.Generator().manual_seed(2)
    f1, f2, f3 = (torch.randn(5, 4, generator=g) for _ in range(3))
    w = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    got = cross_step_alignment([f1, f2, f3], w, 0.2)
    pairs = [info_nce(f2, f1, w, 0.2), info_nce(f3, f1, w, 0.2), info_nce(f3, f2, w, 0.2)]
    assert float(got.total) == pytest.approx(sum(float(p.total) for p in pairs), rel=1e-6)
    assert float(got.weight) == 3 * 4.0
    with pytest.raises(ValueError, match="at least two"):
        cross_step_alignment([f1], w, 0.2)
