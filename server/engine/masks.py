"""Attention masks for a batch of sessions' rows, built with tensor ops on the model's device.

Each batch row b holds one session's new tokens (``n_rows[b]`` of them, then
padding) fed after the ``past[b]`` tokens its KV already holds. The new rows
form a forest given by ``parents`` (a row's parent is an earlier row, or -1
when it hangs from the cached past only): a causal chunk is a chain, a draft
tree is a tree. A row sees the whole cached past, its ancestors and itself.

The keys the attention reads are a session's KV positions [0, key_len): the
past first, then the new rows at past[b] + row (what ``KVPool`` writes), then
whatever else the session's blocks hold. Nothing is computed on the host but the small
integer tensors; the mask itself is a few gathers, so it can be captured in a
CUDA graph.

Positions must grow by exactly one from a row to its child (true of text and
of trees: a node sits one deeper than its parent). That is what lets row i
find whether row j is an ancestor: j is one when i's ancestor
``positions[i] - positions[j]`` steps up is j, found by binary lifting.
"""
from __future__ import annotations

import torch


def ancestor_mask(parents: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Boolean [B, T, T]: row i sees row j (j is i or an ancestor of i).

    parents: [B, T] long, -1 for a root; positions: [B, T] long.
    """
    b, t = parents.shape
    rows = torch.arange(t, device=parents.device)
    up = torch.where(parents >= 0, parents, rows)  # [B, T]: a root is its own parent
    steps = positions[:, :, None] - positions[:, None, :]  # [B, T, T]: how far up j would be from i
    at = rows.view(1, t, 1).expand(b, t, t).contiguous()  # [B, T, T]: where i's walk stands
    jump = up  # [B, T]: 2^k steps up
    for k in range(max(1, (t - 1).bit_length())):
        take = ((steps >> k) & 1).bool() & (steps >= 0)
        at = torch.where(take, jump.gather(1, at.view(b, -1)).view(b, t, t), at)
        jump = jump.gather(1, jump)
    return (steps >= 0) & (at == rows.view(1, 1, t))


def batch_attention_mask(parents: torch.Tensor, positions: torch.Tensor, past: torch.Tensor, n_rows: torch.Tensor,
                         key_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, T, key_len]: 0 where a row may attend a key position, the dtype's minimum elsewhere.

    parents, positions: [B, T] long; past, n_rows: [B] long. Padding rows (row >= n_rows[b]) see
    the past and key 0, so their softmax stays finite; their outputs are never read.
    """
    return mask_from_ancestors(ancestor_mask(parents, positions), past, n_rows, key_len, dtype)


def mask_from_ancestors(tree: torch.Tensor, past: torch.Tensor, n_rows: torch.Tensor, key_len: int,
                        dtype: torch.dtype) -> torch.Tensor:
    """``batch_attention_mask`` from the rows' ancestor mask tree [B, T, T] (``ancestor_mask``), which the
    device step shares with greedy acceptance."""
    b, t, _ = tree.shape
    device = tree.device
    rows = torch.arange(t, device=device)
    keys = torch.arange(key_len, device=device)
    row_of_key = keys.view(1, key_len) - past.view(b, 1)  # [B, L]: which new row a key position holds
    is_new = (row_of_key >= 0) & (row_of_key < n_rows.view(b, 1))  # [B, L]
    sees_new = tree.gather(2, row_of_key.clamp(0, t - 1).view(b, 1, key_len).expand(b, t, key_len))
    allowed = (row_of_key < 0).view(b, 1, key_len) | (sees_new & is_new.view(b, 1, key_len))  # [B, T, L]
    padding = rows.view(1, t) >= n_rows.view(b, 1)  # [B, T]
    allowed = allowed | (padding.view(b, t, 1) & (keys == 0).view(1, 1, key_len))
    mask = torch.zeros(b, 1, t, key_len, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed.view(b, 1, t, key_len), torch.finfo(dtype).min)


def round_up(n: int, step: int) -> int:
    """n rounded up to a multiple of step: the key-length buckets (a few shapes, not one per length)."""
    return -(-n // step) * step
