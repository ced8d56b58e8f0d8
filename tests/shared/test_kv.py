"""shared.kv: crop, keep-rows, per-layer K|V and bytes, the same on a DynamicCache and on paged pool blocks."""
from __future__ import annotations

import random

import pytest
import torch

from edgespec.shared import kv

L, H, D = 3, 2, 4  # layers, KV heads, head dim


def filled_dynamic(n: int, seed: int = 0) -> kv.DynamicKV:
    from transformers import DynamicCache

    store = kv.DynamicKV()
    store.cache = DynamicCache()
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        for layer in range(L):
            store.cache.update(torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D, generator=gen), layer)
    return store


def filled_slot(source: kv.DynamicKV):
    """The same KV in a paged pool of 4-token blocks, its blocks out of order (block tables are not ranges)."""
    from edgespec.server.engine.kv import KVPool, PagedKV

    pool = KVPool(L, H, D, blocks=16, block_size=4, dtype=torch.float32, device=torch.device("cpu"))
    pool.acquire(3)  # taken by someone else: the session's blocks start further in
    paged = PagedKV(pool)
    n = len(source)
    paged.grow_to(n)
    paged.blocks.reverse()
    index = torch.tensor(pool.positions(paged.blocks, 0, n))
    with torch.inference_mode():
        for i, layer in enumerate(source.cache.layers):
            pool.kv[i, 0, :, index] = layer.keys[0]
            pool.kv[i, 1, :, index] = layer.values[0]
    paged.length = n
    return paged


def reference_keep(t: torch.Tensor, past: int, rows: list[int]) -> torch.Tensor:
    """t: [H, S, D] -> the past then the rows, by plain indexing."""
    return torch.cat([t[:, :past], t[:, [past + r for r in rows]]], dim=1)


@pytest.mark.parametrize("seed", range(8))
def test_keep_rows_keeps_the_past_and_the_rows_in_order(seed):
    rng = random.Random(seed)
    past, extra = rng.randint(0, 10), rng.randint(1, 12)
    rows = sorted(rng.sample(range(extra), rng.randint(0, extra)))
    dynamic = filled_dynamic(past + extra, seed)
    slot = filled_slot(dynamic)
    want = [reference_keep(layer.keys[0].clone(), past, rows) for layer in dynamic.cache.layers]
    want_kv = kv.layer_kv(dynamic.cache, 0, past + extra)  # before: [T, L, 2*E_kv]
    kept = list(range(past)) + [past + r for r in rows]
    dynamic.keep_rows(past, rows)
    slot.keep_rows(past, rows)
    assert len(dynamic) == len(slot) == past + len(rows)
    for layer, ref in zip(dynamic.cache.layers, want):
        assert torch.equal(layer.keys[0], ref)
    after = dynamic.layer_kv(0, len(dynamic))
    assert torch.equal(after, want_kv[kept])
    assert torch.equal(slot.layer_kv(0, len(slot)), after)


def test_crop_layer_kv_and_bytes():
    dynamic = filled_dynamic(9)
    assert kv.cache_len(dynamic.cache) == 9
    assert dynamic.nbytes == 2 * L * H * 9 * D * 4
    rows = dynamic.layer_kv(2, 5)
    assert rows.shape == (3, L, 2 * H * D)
    # row t, layer l: keys of every head then values of every head
    assert torch.equal(rows[1, 2, :D], dynamic.cache.layers[2].keys[0, 0, 3])
    assert torch.equal(rows[1, 2, H * D:H * D + D], dynamic.cache.layers[2].values[0, 0, 3])
    slot = filled_slot(dynamic)
    dynamic.crop(4)
    slot.crop(4)
    assert len(dynamic) == len(slot) == 4
    assert dynamic.nbytes == 2 * L * H * 4 * D * 4
    assert slot.nbytes == slot.pool.block_bytes  # the blocks it holds: one of 4 tokens
    assert torch.equal(slot.layer_kv(0, 4), dynamic.layer_kv(0, 4))


def test_blocks_go_back_to_the_pool_on_crop_close_or_when_dropped():
    from edgespec.server.engine.kv import KVPool, PagedKV
    from edgespec.server.errors import SessionCapError

    pool = KVPool(L, H, D, blocks=4, block_size=4, dtype=torch.float32, device=torch.device("cpu"))
    a, b = PagedKV(pool), PagedKV(pool)
    a.grow_to(9)  # three blocks
    b.grow_to(1)
    assert pool.free == 0 and len(a.blocks) == 3
    with pytest.raises(SessionCapError, match="free blocks"):
        PagedKV(pool).grow_to(1)
    a.length = 9
    a.crop(4)  # one block holds 4 positions
    assert pool.free == 2 and len(a.blocks) == 1
    a.close()
    assert pool.free == 3
    a.close()  # twice is harmless
    assert pool.free == 3
    del b
    assert pool.free == 4
