"""Greedy acceptance and KV compaction for a whole batch, on the device, with no host round trip.

Words as in ``shared.verification``: a session's work is causal rows [0, lf]
(lf = ``logits_from``: the root, the last committed token) and tree rows
(lf, n) hanging from the root; row r's argmax is the target's token after row
r. Greedy accepts, walking from the root, the first child (lowest row) whose
token equals its parent's argmax; the bonus token is the argmax at the last
accepted row. ``shared.verification.greedy_walk`` is the host reference; these
tensor forms give the same answer for every session of the batch at once:

- a tree row *matches* when its token is its parent's argmax and no earlier
  sibling carries the same token (that sibling would be tried, and accepted,
  first);
- a tree row is *accepted* when it and every tree ancestor match. At most one
  child of a row matches, so the accepted rows are a chain from the root.

``compact_kv`` then moves every accepted row's K/V to the slot position its
depth gives (behind the root), for all layers and sessions in one gather and
one scatter; rows that stay put are sent to the scratch slot, so the op has one
static shape per bucket.
"""
from __future__ import annotations

import torch


def greedy_accept(ids: torch.Tensor, parents: torch.Tensor, best: torch.Tensor, logits_from: torch.Tensor,
                  n_rows: torch.Tensor, accept: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
    """Boolean [B, T]: the tree rows greedy verification accepts.

    ids, parents, best: [B, T] long (best: argmax at each row, -1 where no logits were taken);
    logits_from, n_rows: [B] long; accept: [B] bool (False: the item asked for no acceptance);
    sees: [B, T, T] bool, row i sees row j (j is i or an ancestor: ``engine_masks.ancestor_mask``).
    """
    b, t = ids.shape
    rows = torch.arange(t, device=ids.device).view(1, t)
    tree_row = accept.view(b, 1) & (rows > logits_from.view(b, 1)) & (rows < n_rows.view(b, 1))  # [B, T]
    parent_best = best.gather(1, parents.clamp(min=0))  # [B, T]: the argmax each row's token is checked against
    match = tree_row & (ids == parent_best)
    # [B, T(i), T(j)]: j is an earlier tree sibling of i with i's token
    twin = ((parents.view(b, t, 1) == parents.view(b, 1, t)) & (ids.view(b, t, 1) == ids.view(b, 1, t))
            & tree_row.view(b, 1, t) & (rows.view(1, 1, t) < rows.view(1, t, 1)))
    ok = match & ~twin.any(2)  # [B, T]
    failed_ancestor = (sees & (tree_row & ~ok).view(b, 1, t)).any(2)  # [B, T]: some tree ancestor (or itself) fails
    return tree_row & ~failed_ancestor


def compact_kv(kv: torch.Tensor, slots: torch.Tensor, past: torch.Tensor, logits_from: torch.Tensor,
               positions: torch.Tensor, accepted: torch.Tensor, scratch: int) -> None:
    """Move the accepted rows' K/V behind the root, in place, every layer and session in one copy.

    kv: the pool [L, 2, slots + 1, H_kv, S_max, D]; slots, past, logits_from: [B] long; positions: [B, T] long;
    accepted: [B, T] bool (``greedy_accept``). Row r of batch row b sits at slot position past + r.
    """
    b, t = positions.shape
    rows = torch.arange(t, device=positions.device).view(1, t)
    src_pos = past.view(b, 1) + rows  # [B, T]
    # where each row goes when kept: the root's own slot position plus the row's depth below the root (a child's
    # position is its parent's + 1)
    root_pos = positions.gather(1, logits_from.clamp(max=t - 1).view(b, 1))  # [B, 1] (T: a chunk without logits)
    dst_pos = past.view(b, 1) + logits_from.view(b, 1) + positions - root_pos  # [B, T]
    move = accepted & (dst_pos != src_pos)
    src_slot = torch.where(move, slots.view(b, 1), scratch)  # rows that stay put copy scratch onto itself
    src_pos = torch.where(move, src_pos, rows).clamp(max=kv.shape[4] - 1)
    dst_pos = torch.where(move, dst_pos, rows).clamp(max=kv.shape[4] - 1)
    picked = kv[:, :, src_slot, :, src_pos]  # [B, T, L, 2, H_kv, D]: a copy, so sources and targets may overlap
    kv[:, :, src_slot, :, dst_pos] = picked


def accepted_nodes(accepted_row: list[int], positions: tuple[int, ...], logits_from: int) -> tuple[int, ...]:
    """Host side of one readback row: the accepted draft node indices, root to leaf.

    accepted_row: [T] 0/1 flags of one batch row; positions: that work's positions.
    """
    rows = [r for r, flag in enumerate(accepted_row) if flag]
    rows.sort(key=lambda r: positions[r])
    return tuple(r - logits_from - 1 for r in rows)
