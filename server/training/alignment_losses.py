"""Loss terms of the alignment recipes (HASS, CORAL), as pure functions of tensors.

Same conventions as ``losses.py``: per-row weights ``w`` (0 = the row does not count),
each function returns a ``Term`` (weighted sum, weight total) so windows of any length
add up in one batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .losses import Term


def topk_distillation(draft_logits: torch.Tensor, target_logits: torch.Tensor, w: torch.Tensor, k: int) -> Term:
    """HASS's harmonized objective distillation: cross-entropy restricted to the target's K most
    probable tokens, -sum_{x in topK(p)} p(x) log q(x).

    p and q are softmaxes over the whole (draft) vocabulary; p is not renormalised over the K
    tokens, so a row whose target is sure of one token weighs that token as the full CE would,
    while the long tail (where a small drafter wastes capacity) drops out.
    draft_logits, target_logits: [T, V]; w: [T].
    """
    if k < 1:
        raise ValueError(f"top-K distillation needs K >= 1, got {k}")
    k = min(k, target_logits.shape[-1])
    p = torch.softmax(target_logits.float(), -1)
    top_p, top_ids = p.topk(k, dim=-1)  # [T, K]
    logq = torch.log_softmax(draft_logits.float(), -1).gather(-1, top_ids)
    per_row = -(top_p * logq).sum(-1)
    return Term((per_row * w).sum(), w.sum())


def info_nce(queries: torch.Tensor, keys: torch.Tensor, w: torch.Tensor, temperature: float) -> Term:
    """InfoNCE with cosine similarity: row i of ``queries`` should match row i of ``keys``
    (its positive) rather than any other row of ``keys`` (the negatives).

    per_row[i] = -log( exp(cos(q_i, k_i)/t) / sum_j exp(cos(q_i, k_j)/t) ).
    queries, keys: [T, D]; w: [T] weights of the query rows.
    """
    if temperature <= 0:
        raise ValueError(f"the InfoNCE temperature must be > 0, got {temperature}")
    if queries.shape != keys.shape:
        raise ValueError(f"queries {tuple(queries.shape)} and keys {tuple(keys.shape)} must pair row by row")
    q = F.normalize(queries.float(), dim=-1)
    k = F.normalize(keys.float(), dim=-1)
    sim = q @ k.T / temperature  # [T, T]
    per_row = F.cross_entropy(sim, torch.arange(q.shape[0], device=q.device), reduction="none")
    return Term((per_row * w).sum(), w.sum())


def cross_step_alignment(features: list[torch.Tensor], w: torch.Tensor, temperature: float) -> Term:
    """CORAL's cross-step representation alignment over unrolled steps.

    features[s]: [m, D] the drafter's features of the same m positions at unrolled step s+1
    (row i of every step is the same position). For every pair of steps a < b, InfoNCE pulls
    step b's feature of a position towards step a's feature of it and away from step a's
    features of the other positions; the pairs add up (each pair counts like one term).
    """
    if len(features) < 2:
        raise ValueError("cross-step alignment needs features of at least two unrolled steps")
    return sum(info_nce(features[b], features[a], w, temperature) for b in range(1, len(features)) for a in range(b))
