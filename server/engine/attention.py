"""Attention straight from the paged pool: FlexAttention with a block mask built from the block tables.

The SDPA path hands each batch row its session's keys gathered out of the pool in logical order, with a
dense [B, 1, T, K] mask (``masks``): every layer copies the batch's keys, and every row reads every
key up to the bucket's length. Here the attention reads the pool itself, one layer being a [1, H_kv, P, D]
view (``kv``), through a ``BlockMask``:

- for each batch row, the KV blocks it reads are its session's block table: the blocks wholly in the
  session's past are *full* blocks (every row of the session sees every key in them, so the kernel applies
  no mask there), the rest, up to the block holding its last new row, are *partial* blocks;
- in a partial block the ``mask_mod`` decides per key: a physical position ``kv`` is block ``kv // bs``,
  whose logical index in any session that holds it is ``block_pos[block]`` (the same in every table: a
  shared prefix keeps its blocks' places), so its logical position is known; the key is seen when the block
  is the row's session's at that index, and the position is in the past, or is a new row that the query
  row has as an ancestor (or is itself).

No gather, no ``repeat_kv``: the query heads share their KV head inside the kernel (``enable_gqa``, any
ratio: Qwen2.5's 6 and 7 included, where transformers' own flex path copies K and V), and no dense mask
over the keys. The function is registered with transformers' ``AttentionInterface`` under ``NAME``; it
takes the pool path only when the step passes the pool's ``BlockMask`` as the attention mask (which
transformers' mask builders hand through as it is, as a ready 4-D mask), and is SDPA otherwise (the same
model object may serve other callers). On a CPU, eager FlexAttention is PyTorch's
reference (it materialises the scores over the whole pool: tests use small pools); compiled, it is a fused
kernel on both the CPU and CUDA. On CUDA outside a compiled step the call goes through a compiled
FlexAttention (sizes made symbolic after the first shape), so a captured graph replays the fused kernel.
"""
from __future__ import annotations

import warnings
import torch
import torch._dynamo
from torch.nn.attention.flex_attention import BlockMask, flex_attention

NAME = "edgespec_pool"  # the attention implementation's name in transformers' registries
Q_BLOCK = 128  # query rows a block-mask row covers (FlexAttention's default tile)

_registered = False
_compiled_flex = None


def register() -> None:
    """Register ``NAME`` with transformers: this attention, and SDPA's mask for callers that build their own."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, pool_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    _registered = True


def pool_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' attention signature. query [B, H_q, T, D]; key, value: the pool layer [1, H_kv, P, D] when
    attention_mask is the pool's ``BlockMask``, else what SDPA takes. Returns ([B, T, H_q, D], None)."""
    if not isinstance(attention_mask, BlockMask):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = _flex(query)(query, key, value, block_mask=attention_mask, scale=scaling,
                       enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _flex(query: torch.Tensor):
    """The FlexAttention to call: as is inside a compiled step (the compiler fuses it) and on a CPU (eager
    reference, for tests), compiled on its own on CUDA so an eager or captured step runs the fused kernel."""
    global _compiled_flex
    if torch.compiler.is_compiling():
        return flex_attention
    if query.device.type != "cuda":
        return _quiet_flex
    if _compiled_flex is None:
        # dynamic=None: the first shape compiles as it is, a second makes the sizes symbolic, so the few hundred
        # buckets of a server's grid share a couple of kernels instead of compiling one each at start
        _compiled_flex = torch.compile(flex_attention, fullgraph=True, dynamic=None)
    cfg = torch._dynamo.config  # per thread: the scheduler's thread compiles shapes the capture did not see
    cfg.recompile_limit = max(cfg.recompile_limit, 64)
    return _compiled_flex


def _quiet_flex(*args, **kwargs):
    with warnings.catch_warnings():  # eager flex warns on every call that it is not fused: known, and wanted here
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(*args, **kwargs)


def pool_block_mask(rows, sees: torch.Tensor, block_pos: torch.Tensor, block_size: int,
                    pool_positions: int) -> BlockMask:
    """The block mask of one step over the pool, for a batch as one run of N rows (``rows.Rows``).

    sees: [N, N] bool, row i sees row j (``rows.sees_rows``); block_pos: [pool blocks] long, the pool's
    persistent logical-index-of-each-block buffer, written here for the batch's blocks; pool_positions: P.

    The query rows are cut in tiles of ``Q_BLOCK``; a tile lists the distinct blocks any of its sessions reads
    (a block two sessions share is listed once: listed twice, its keys would count twice in the softmax). A
    tile of one session's rows (a prompt chunk, a long tree) gets the blocks wholly in that session's past as
    full blocks, where the kernel applies no mask; a tile of several sessions reads every block through the
    mask function (each row sees its own session's keys only). The lists are as long as the pool has blocks,
    whatever the batch: one static shape per bucket.
    """
    s, mb = rows.blocks.shape
    n = rows.seq.shape[0]
    pool_blocks = pool_positions // block_size
    device = rows.blocks.device
    index = torch.arange(mb, device=device)
    block_pos.index_put_((rows.blocks,), index.expand(s, mb))  # scratch entries collide: it is never a real key
    tiles = -(-n // Q_BLOCK)
    tile = torch.arange(n, device=device) // Q_BLOCK
    holds = torch.zeros(tiles, s + 1, dtype=torch.bool, device=device)  # tile holds a row of session s
    holds.index_put_((tile, torch.where(rows.real, rows.seq, s)), torch.ones((), dtype=torch.bool, device=device))
    holds = holds[:, :s]
    alone = holds.sum(1) == 1  # [tiles]: a tile of one session's rows
    full = torch.div(rows.past, block_size, rounding_mode="floor")  # [S] blocks every row of a session sees whole
    used = torch.div(rows.past + rows.n_rows + block_size - 1, block_size, rounding_mode="floor")  # [S] read at all
    reads = holds.view(tiles, s, 1) & (index.view(1, 1, mb) < used.view(1, s, 1))  # [tiles, S, MB]
    whole = reads & alone.view(tiles, 1, 1) & (index.view(1, 1, mb) < full.view(1, s, 1))
    full_count, full_idx = _distinct_blocks(whole, rows.blocks, pool_blocks)
    part_count, part_idx = _distinct_blocks(reads & ~whole, rows.blocks, pool_blocks)
    seq, start, past, n_rows, blocks = rows.seq, rows.start, rows.past, rows.n_rows, rows.blocks

    def mask_mod(b, h, q, kv):
        # the row's session and whether it is one are found here from ``seq`` (an input), not read from tensors
        # computed from it: Inductor's CPU kernel takes no captured buffer that is an unrealised pointwise result
        sq = seq[q].clamp(min=0)
        blk = kv // block_size
        j = block_pos[blk]
        mine = blocks[sq, j.clamp(0, mb - 1)] == blk  # the block is the row's session's, at index j
        new = j * block_size + kv % block_size - past[sq]
        is_new = (new >= 0) & (new < n_rows[sq])
        key_row = (start[sq] + new).clamp(0, n - 1)
        return (seq[q] >= 0) & mine & ((new < 0) | (is_new & sees[q, key_row]))

    return BlockMask.from_kv_blocks(part_count, part_idx, full_count, full_idx, BLOCK_SIZE=(Q_BLOCK, block_size),
                                    mask_mod=mask_mod, seq_lengths=(n, pool_positions), compute_q_blocks=False)


def _distinct_blocks(chosen: torch.Tensor, blocks: torch.Tensor, pool_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """chosen: [tiles, S, MB] bool over the sessions' block tables [S, MB]. Returns each tile's count of distinct
    chosen blocks [1, 1, tiles] and their indices first in a [1, 1, tiles, pool_blocks] list (int32, as
    ``BlockMask`` takes them): a presence map over the pool's blocks, then each present block's place in the
    list from a running count, all static shapes."""
    tiles = chosen.shape[0]
    device = blocks.device
    tile = torch.arange(tiles, device=device).view(tiles, 1, 1).expand_as(chosen)
    present = torch.zeros(tiles, pool_blocks + 1, dtype=torch.bool, device=device)  # the last column: not chosen
    present.index_put_((tile, torch.where(chosen, blocks.expand_as(chosen), pool_blocks)),
                       torch.ones((), dtype=torch.bool, device=device))
    present = present[:, :pool_blocks]
    place = torch.where(present, present.long().cumsum(1) - 1, pool_blocks)
    listed = torch.zeros(tiles, pool_blocks + 1, dtype=torch.long, device=device)
    listed.scatter_(1, place, torch.arange(pool_blocks, device=device).expand(tiles, pool_blocks))
    count = present.sum(1)
    return count.to(torch.int32).view(1, 1, tiles), listed[:, :pool_blocks].to(torch.int32).view(1, 1, tiles, -1)
