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

``compact_kv`` then moves every accepted row's K/V to the position its depth
gives (behind the root, through the session's block table), for all layers and
sessions in one gather and one scatter; rows that stay put are sent to the
scratch block, so the op has one static shape per bucket.
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


def physical(blocks: torch.Tensor, logical: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical pool positions of logical positions: blocks [B, MB] long (each batch row's block table),
    logical [B, N] long (within the table's reach) -> [B, N] long."""
    return blocks.gather(1, torch.div(logical, block_size, rounding_mode="floor")) * block_size + logical % block_size


def compact_kv(kv: torch.Tensor, blocks: torch.Tensor, past: torch.Tensor, logits_from: torch.Tensor,
               positions: torch.Tensor, accepted: torch.Tensor, scratch: int, block_size: int) -> None:
    """Move the accepted rows' K/V behind the root, in place, every layer and session in one copy.

    kv: the pool [L, 2, H_kv, P, D]; blocks: [B, MB] long block tables; past, logits_from: [B] long;
    positions: [B, T] long; accepted: [B, T] bool (``greedy_accept``). Row r of batch row b sits at logical
    position past + r. Rows that stay put copy the scratch block onto itself (one static shape per bucket).
    """
    b, t = positions.shape
    reach = blocks.shape[1] * block_size - 1
    rows = torch.arange(t, device=positions.device).view(1, t)
    src = past.view(b, 1) + rows  # [B, T] logical
    # where each row goes when kept: the root's own position plus the row's depth below the root (a child's
    # position is its parent's + 1)
    root_pos = positions.gather(1, logits_from.clamp(max=t - 1).view(b, 1))  # [B, 1] (T: a chunk without logits)
    dst = past.view(b, 1) + logits_from.view(b, 1) + positions - root_pos  # [B, T] logical
    move = accepted & (dst != src)
    stay = scratch * block_size + rows % block_size  # [1, T]
    src_phys = torch.where(move, physical(blocks, src.clamp(0, reach), block_size), stay)
    dst_phys = torch.where(move, physical(blocks, dst.clamp(0, reach), block_size), stay)
    picked = kv[:, :, :, src_phys]  # [L, 2, H_kv, B, T, D]: a copy, so sources and targets may overlap
    kv[:, :, :, dst_phys] = picked


def accepted_nodes(accepted_row: list[int], positions: tuple[int, ...], logits_from: int) -> tuple[int, ...]:
    """Host side of one readback row: the accepted draft node indices, root to leaf.

    accepted_row: [T] 0/1 flags of one batch row; positions: that work's positions.
    """
    rows = [r for r, flag in enumerate(accepted_row) if flag]
    rows.sort(key=lambda r: positions[r])
    return tuple(r - logits_from - 1 for r in rows)
