"""Attention straight from the paged pool: FlexAttention with a block mask built from the block tables.

The SDPA path hands each batch row its session's keys gathered out of the pool in logical order, with a
dense [B, 1, T, K] mask (``engine_masks``): every layer copies the batch's keys, and every row reads every
key up to the bucket's length. Here the attention reads the pool itself, one layer being a [1, H_kv, P, D]
view (``engine_kv``), through a ``BlockMask``:

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


def pool_block_mask(blocks: torch.Tensor, past: torch.Tensor, n_rows: torch.Tensor, sees: torch.Tensor,
                    block_pos: torch.Tensor, block_size: int, pool_positions: int,
                    pad_indices: int | None = None) -> BlockMask:
    """The block mask of one step over the pool.

    blocks: [B, MB] long block tables (padded with the scratch block); past, n_rows: [B] long; sees: [B, T, T]
    bool, row i sees new row j (``engine_masks.ancestor_mask``); block_pos: [blocks + 1] long, the pool's
    persistent logical-index-of-each-block buffer, written here for the batch's blocks; pool_positions: P.
    pad_indices: pad the block lists to this many entries (the CPU's compiled kernel wants them to cover the
    whole pool).
    """
    b, mb = blocks.shape
    t = sees.shape[1]
    device = blocks.device
    index = torch.arange(mb, device=device)
    block_pos.index_put_((blocks,), index.expand(b, mb))  # scratch entries collide: it is never a real key
    full = torch.div(past, block_size, rounding_mode="floor")  # [B] blocks every row sees whole
    used = torch.div(past + n_rows + block_size - 1, block_size, rounding_mode="floor")  # [B] blocks read at all
    partial = blocks.gather(1, (index.view(1, mb) + full.view(b, 1)).clamp(max=mb - 1))  # [B, MB] from `full` on
    full_idx, partial_idx = blocks, partial
    if pad_indices is not None and pad_indices > mb:
        pad = blocks[:, -1:].expand(b, pad_indices - mb)
        full_idx, partial_idx = torch.cat([blocks, pad], 1), torch.cat([partial, pad], 1)
    q_blocks = -(-t // Q_BLOCK)

    def per_q(x: torch.Tensor) -> torch.Tensor:  # [B, N] -> [B, 1, Q blocks, N] int32, the same for each q block
        return x.to(torch.int32).view(b, 1, 1, -1).expand(b, 1, q_blocks, x.shape[-1]).contiguous()

    def counts(x: torch.Tensor) -> torch.Tensor:  # [B] -> [B, 1, Q blocks] int32
        return x.to(torch.int32).view(b, 1, 1).expand(b, 1, q_blocks).contiguous()

    def mask_mod(bi, h, q, kv):
        blk = kv // block_size
        j = block_pos[blk]
        mine = blocks[bi, j.clamp(0, mb - 1)] == blk  # the block is this row's session's, at index j
        logical = j * block_size + kv % block_size
        new = logical - past[bi]
        is_new = (new >= 0) & (new < n_rows[bi])
        return mine & ((new < 0) | (is_new & sees[bi, q, new.clamp(0, t - 1)]))

    return BlockMask.from_kv_blocks(counts(used - full), per_q(partial_idx), counts(full), per_q(full_idx),
                                    BLOCK_SIZE=(Q_BLOCK, block_size), mask_mod=mask_mod,
                                    seq_lengths=(t, pool_positions), compute_q_blocks=False)
