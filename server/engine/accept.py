"""Greedy acceptance and KV compaction for a whole batch, on the device, with no host round trip: the rules,
and the host's side of a readback (the tensor forms are ``rows``'s, over a batch's run of rows).

Words as in ``shared.verification``: a session's work is causal rows [0, lf]
(lf = ``logits_from``: the root, the last committed token) and tree rows
(lf, n) hanging from the root; row r's argmax is the target's token after row
r. Greedy accepts, walking from the root, the first child (lowest row) whose
token equals its parent's argmax; the bonus token is the argmax at the last
accepted row. ``shared.verification.greedy_walk`` is the host reference; the
tensor forms give the same answer for every session of the batch at once:

- a tree row *matches* when its token is its parent's argmax and no earlier
  sibling carries the same token (that sibling would be tried, and accepted,
  first);
- a tree row is *accepted* when it and every tree ancestor match. At most one
  child of a row matches, so the accepted rows are a chain from the root.

``rows.accept_rows`` computes this over a batch's run of rows, and
``rows.compact_rows`` then moves every accepted row's K/V to the position its depth
gives (behind the root, through the session's block table), for all layers and
sessions in one gather and one scatter; rows that stay put are sent to the
scratch block, so the op has one static shape per bucket.
"""
from __future__ import annotations

import torch


def physical(blocks: torch.Tensor, logical: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical pool positions of logical positions: blocks [B, MB] long (each batch row's block table),
    logical [B, N] long (within the table's reach) -> [B, N] long."""
    return blocks.gather(1, torch.div(logical, block_size, rounding_mode="floor")) * block_size + logical % block_size


def accepted_nodes(accepted_row: list[int], positions: tuple[int, ...], logits_from: int) -> tuple[int, ...]:
    """Host side of one readback row: the accepted draft node indices, root to leaf.

    accepted_row: 0/1 flags of one work's rows; positions: that work's positions.
    """
    rows = [r for r, flag in enumerate(accepted_row) if flag]
    rows.sort(key=lambda r: positions[r])
    return tuple(r - logits_from - 1 for r in rows)
