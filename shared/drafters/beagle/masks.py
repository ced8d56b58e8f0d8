"""Attention masks of the Beagle drafter (cross-attention speculative decoding), as pure functions in the
form of ``blocks``' masks (True = may attend, [queries, keys]) over the positions 0..n-1 of one window.

Query t predicts the state h_t (``model``), so it must never see h_t itself: the **diagonal is masked**,
and query t sees states j < t only. A row may see nothing (the first position): the drafter always adds
a zero "sink" key, so such a row reads zeros, not NaN.

Training works in blocks of k positions, cut at a random ``offset`` (0 <= offset < k): the
positions before ``offset`` form a shorter first block starting at 0. ``block_starts`` gives
every position's block start b(t). Inside a block, query t = b + m plays draft step m + 1
of a draft rooted at c_b: the target's states exist up to b - 1, everything from b on is
the drafter's to predict.
"""
from __future__ import annotations

import torch


def cross_mask(n: int, device=None) -> torch.Tensor:
    """[n, n] teacher-forced cross-attention: query t sees states j < t (diagonal masked)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)


def block_starts(n: int, k: int, offset: int, device=None) -> torch.Tensor:
    """[n] start b(t) of each position's block: blocks of ``k`` from ``offset`` on, [0, offset) before."""
    if k < 1:
        raise ValueError(f"the block size k must be >= 1, got {k}")
    if not 0 <= offset < k:
        raise ValueError(f"the block offset must be in 0..{k - 1}, got {offset}")
    t = torch.arange(n, device=device)
    start = offset + torch.div(t - offset, k, rounding_mode="floor") * k
    return torch.where(t < offset, torch.zeros_like(t), start)


def inverse_block_mask(n: int, k: int, offset: int, device=None) -> torch.Tensor:
    """[n, n] Beagle's early stage: query t sees only states before its block, j < b(t).

    The block's own k states (the window of local keys, the diagonal among them) are hidden,
    so query b + m must predict h_{b+m} from states that end m + 1 positions back: every
    block trains predictions 1..k tokens past the last verified state at once (multi-token
    prediction). With k = 1 this is ``cross_mask``.
    """
    b = block_starts(n, k, offset, device)
    j = torch.arange(n, device=device)
    return j[None, :] < b[:, None]


def simulated_mask(n: int, k: int, offset: int, device=None) -> torch.Tensor:
    """[n, 2n] Beagle's late stage, keys [target states 0..n-1 ; states predicted by the previous step 0..n-1].

    Query t sees the target's states before its block (j < b(t)) and the previous step's
    predictions inside its block before itself (b(t) <= j < t): what drafting sees at step
    t - b(t) + 1. Running this k times, each time over the last step's (detached) predictions,
    makes step i exact for block positions m < i, with keys that never grow past 2n.
    """
    b = block_starts(n, k, offset, device)
    j = torch.arange(n, device=device)
    t = j[:, None]
    target_part = j[None, :] < b[:, None]
    own_part = (j[None, :] >= b[:, None]) & (j[None, :] < t)
    return torch.cat([target_part, own_part], dim=1)


def late_step_weights(n: int, k: int, offset: int, step: int, device=None) -> torch.Tensor:
    """[n] loss weight of each position at simulated step ``step`` (1..k): beta(i, j) = k - i + 1.

    i = ``step``, j = m + 1 the position's place in its block. Positions j < i were already
    exact at an earlier step and would count twice: weight 0. Earlier steps weigh more because
    a draft chain stops at its first miss.
    """
    if not 1 <= step <= k:
        raise ValueError(f"simulated steps run 1..{k}, got {step}")
    m = torch.arange(n, device=device) - block_starts(n, k, offset, device)
    return torch.where(m + 1 >= step, float(k - step + 1), 0.0)


def chain_mask(n: int, step: int, device=None) -> torch.Tensor:
    """[n, n * step] drafting chains from every root at once (validation, exact per chain).

    Keys: [target states 0..n-1 ; for each earlier step s = 1..step-1, the n states predicted
    at step s, one per root]. The chain rooted at c_r sees the target's states j < r and, of
    each earlier step, only its own prediction (position r + s - 1): exactly what the drafter
    holds at depth ``step`` of a draft rooted at r.
    """
    if step < 1:
        raise ValueError(f"draft steps start at 1, got {step}")
    eye = torch.eye(n, dtype=torch.bool, device=device)
    return torch.cat([cross_mask(n, device)] + [eye] * (step - 1), dim=1)
