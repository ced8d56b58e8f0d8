"""A batch as one run of rows: the device step's layout (``step``).

Every session's new tokens sit one after another in a single sequence of N rows (padding rows last), the
layout vLLM feeds its model: projections, MLP, norms and the LM head see [N, E] with no per-session padding,
so a step's shape is its total row count (a 17-node tree and its root are 18 rows, not 32, and a decode row
beside it one more, not another 32). What is per session lives in a small table of S sessions (past length,
rows, first logits row, acceptance asked, first row, block table); each row names its session (-1: padding).

Only attention needs to know which rows belong together, and it is told through its mask: the pool
attention's block mask (``attention``) or, for SDPA, a dense mask over every session's keys gathered
one after another (``rows_sdpa_mask``). Acceptance and KV compaction work on the same rows
(``accept_rows``, ``compact_rows``); a row's parent is the flat index of an earlier row of its session.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .masks import ancestor_mask


@dataclass
class Rows:
    """The step's inputs as device tensors (views of the packed upload)."""

    ids: torch.Tensor  # [N] token ids (0 for padding)
    positions: torch.Tensor  # [N] RoPE positions
    parents: torch.Tensor  # [N] flat index of the parent row, -1 for a row hanging from the past only
    seq: torch.Tensor  # [N] the row's session (-1: padding)
    past: torch.Tensor  # [S] tokens a session's KV holds before its rows
    n_rows: torch.Tensor  # [S] rows it feeds
    logits_from: torch.Tensor  # [S] its first row with logits (n_rows: none)
    accept: torch.Tensor  # [S] bool: greedy acceptance asked
    start: torch.Tensor  # [S] its first row's flat index
    blocks: torch.Tensor  # [S, MB] its block table, padded with the scratch block

    @property
    def real(self) -> torch.Tensor:
        """[N] bool: rows that belong to a session."""
        return self.seq >= 0

    @property
    def owner(self) -> torch.Tensor:
        """[N] each row's session, padding rows counted as session 0's (always masked by ``real``)."""
        return self.seq.clamp(min=0)

    @property
    def local(self) -> torch.Tensor:
        """[N] each row's index within its session's rows."""
        n = self.seq.shape[0]
        return torch.arange(n, device=self.seq.device) - self.start[self.owner]


def sees_rows(rows: Rows) -> torch.Tensor:
    """[N, N] bool: row i sees row j (j is i or one of i's ancestors, so of i's session). A padding row is a
    root of its own and sees itself only."""
    return ancestor_mask(rows.parents.view(1, -1), rows.positions.view(1, -1))[0]


def physical_rows(blocks: torch.Tensor, seq: torch.Tensor, logical: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical pool positions of logical positions [N] of sessions seq [N] through their block tables."""
    return blocks[seq, torch.div(logical, block_size, rounding_mode="floor")] * block_size + logical % block_size


def write_positions(rows: Rows, keys: int, scratch: int, block_size: int) -> torch.Tensor:
    """[N] physical position each row's K/V goes to: its session's past + its index, or the scratch block."""
    n = rows.seq.shape[0]
    logical = (rows.past[rows.owner] + rows.local).clamp(0, keys - 1)
    spare = scratch * block_size + torch.arange(n, device=rows.seq.device) % block_size
    return torch.where(rows.real, physical_rows(rows.blocks, rows.owner, logical, block_size), spare)


def rows_sdpa_mask(rows: Rows, sees: torch.Tensor, keys: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, N, S * K] over every session's K logical keys one after another (what
    ``key_positions`` gathers): a row sees its own session's past, and its new rows it has as ancestors. A
    padding row sees key 0 only, so its softmax stays finite."""
    s = rows.past.shape[0]
    n = rows.seq.shape[0]
    device = rows.seq.device
    new = torch.arange(keys, device=device).view(1, keys) - rows.past.view(s, 1)  # [S, K]: new row a key is, if any
    is_new = (new >= 0) & (new < rows.n_rows.view(s, 1))
    key_row = (rows.start.view(s, 1) + new).clamp(0, n - 1)  # [S, K] its flat row
    sees_new = sees[:, key_row.view(-1)].view(n, s, keys)
    mine = rows.owner.view(n, 1) == torch.arange(s, device=device).view(1, s)  # [N, S]
    allowed = mine.view(n, s, 1) & ((new < 0).view(1, s, keys) | (is_new.view(1, s, keys) & sees_new))
    allowed = allowed & rows.real.view(n, 1, 1)
    first_key = (torch.arange(s, device=device).view(s, 1) == 0) & (torch.arange(keys, device=device).view(1, keys) == 0)
    allowed = allowed | ((~rows.real).view(n, 1, 1) & first_key.view(1, s, keys))
    mask = torch.zeros(1, 1, n, s * keys, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed.view(1, 1, n, s * keys), torch.finfo(dtype).min)


def key_positions(rows: Rows, keys: int, block_size: int) -> torch.Tensor:
    """[1, S * K] physical positions of every session's logical keys [0, K), one session after another."""
    s = rows.blocks.shape[0]
    logical = torch.arange(keys, device=rows.blocks.device).expand(s, keys)
    seq = torch.arange(s, device=rows.blocks.device).view(s, 1).expand(s, keys)
    return physical_rows(rows.blocks, seq, logical, block_size).reshape(1, s * keys)


def tree_rows(rows: Rows) -> torch.Tensor:
    """[N] bool: rows after their session's root whose acceptance was asked (the tree's nodes)."""
    owner = rows.owner
    return rows.real & rows.accept[owner] & (rows.local > rows.logits_from[owner])


def accept_rows(rows: Rows, best: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
    """[N] bool: the tree rows greedy verification accepts (``accept``'s rules: a row matches when its
    token is its parent's argmax and no earlier sibling has its token; accepted when it and all its tree
    ancestors match). best: [N] argmax at each row, -1 where none was taken."""
    n = rows.ids.shape[0]
    tree = tree_rows(rows)
    match = tree & (rows.ids == best[rows.parents.clamp(min=0)])
    index = torch.arange(n, device=rows.ids.device)
    # j is an earlier tree sibling of i with i's token: greedy tries it first, so i cannot be the one accepted
    twin = ((rows.parents.view(n, 1) == rows.parents.view(1, n)) & (rows.ids.view(n, 1) == rows.ids.view(1, n))
            & tree.view(1, n) & (index.view(1, n) < index.view(n, 1)))
    ok = match & ~twin.any(1)
    failed_ancestor = (sees & (tree & ~ok).view(1, n)).any(1)
    return tree & ~failed_ancestor


def compact_rows(kv: torch.Tensor, rows: Rows, accepted: torch.Tensor, scratch: int, block_size: int) -> None:
    """Move every accepted row's K/V behind its root (to the position its depth gives), in place, all layers and
    sessions in one copy. Rows that stay put copy the scratch block onto
    itself, so the copy has the bucket's shape whatever was accepted."""
    n = rows.ids.shape[0]
    owner = rows.owner
    reach = rows.blocks.shape[1] * block_size - 1
    past, lf = rows.past[owner], rows.logits_from[owner]
    src = past + rows.local
    root = rows.positions[(rows.start[owner] + lf).clamp(max=n - 1)]
    dst = past + lf + rows.positions - root  # the root's place plus the row's depth below it
    move = accepted & (dst != src)
    stay = scratch * block_size + torch.arange(n, device=kv.device) % block_size
    src_phys = torch.where(move, physical_rows(rows.blocks, owner, src.clamp(0, reach), block_size), stay)
    dst_phys = torch.where(move, physical_rows(rows.blocks, owner, dst.clamp(0, reach), block_size), stay)
    picked = kv[:, :, :, src_phys]  # a copy: sources and targets may overlap
    kv[:, :, :, dst_phys] = picked
