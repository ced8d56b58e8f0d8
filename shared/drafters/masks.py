"""Attention masks of the learned drafters, as pure functions.

Boolean masks: True = the query may attend to the key. ``additive`` turns one
into the float form attention takes (0 / -inf). Shapes are [queries, keys].

Positions in training: a sequence of n tokens c_0..c_{n-1}. Target features lag
one token (proto/README.md, one step end to end): when c_0..c_{n-1} are committed, features exist
for c_0..c_{n-2}. A query at position i "is drafting" with the features up to
its *bound* b(i) visible, b(i) <= i - 1; ``bounds`` are the per-query b(i)
(-1 = no feature visible yet).
"""
from __future__ import annotations

import torch


def additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask -> additive float mask (0 where allowed, -inf where not)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))


def causal_mask(n: int, device=None) -> torch.Tensor:
    """[n, n]: query i sees keys j <= i."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def step_bounds(n: int, T: int, offset: int = 0, device=None) -> torch.Tensor:
    """[n] MoA's T-step bound: the sequence is cut into segments of T tokens starting at
    ``offset``; every query in a segment sees features only before the segment start.

    So the first query of a segment is one token past the last verified feature (the
    root of a draft) and the last is T tokens past it: the drafter learns to predict up to
    T tokens beyond what the server has verified. Queries before ``offset`` see nothing.
    """
    if T < 1:
        raise ValueError(f"the step bound T must be >= 1, got {T}")
    i = torch.arange(n, device=device)
    start = offset + torch.div(i - offset, T, rounding_mode="floor") * T
    return torch.where(i < offset, torch.full_like(i, -1), start - 1)


def bounded_mask(bounds: torch.Tensor, n_keys: int) -> torch.Tensor:
    """[len(bounds), n_keys]: query i sees keys j <= bounds[i] (the Cross-Attention memory)."""
    j = torch.arange(n_keys, device=bounds.device)
    return j[None, :] <= bounds[:, None]


def mixed_kv_mask(bounds: torch.Tensor) -> torch.Tensor:
    """[n, 2n] for keys [target's own K/V of positions 0..n-1 ; drafter-computed K/V of 0..n-1].

    TLI layers at query i use the target's K/V (sent by the server) up to its bound and
    their own K/V, computed from predicted activations, for positions bound+1..i: what the
    client holds while drafting.
    """
    n = bounds.shape[0]
    true_part = bounded_mask(bounds, n)
    j = torch.arange(n, device=bounds.device)
    i = j[:, None]
    own_part = (j[None, :] > bounds[:, None]) & (j[None, :] <= i)
    return torch.cat([true_part, own_part], dim=1)


def unrolled_mask(n: int, step: int, device=None) -> torch.Tensor:
    """[n, n * step] mask for step ``step`` (>= 2) of unrolled drafting (training-time test).

    Keys are [teacher-forced rows 0..n-1 ; rows of unrolled steps 2..step, n each]. The
    query of start t at this step sees teacher-forced rows j <= t and, for every earlier
    unrolled step, only the row of the same start t (its own draft chain), itself included.
    """
    if step < 2:
        raise ValueError(f"unrolled steps start at 2, got {step}")
    eye = torch.eye(n, dtype=torch.bool, device=device)
    return torch.cat([causal_mask(n, device)] + [eye] * (step - 1), dim=1)

