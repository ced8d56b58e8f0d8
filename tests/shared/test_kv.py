"""shared.kv: crop, keep-rows, per-layer K|V and bytes, the same on a DynamicCache and on a pool slot."""
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
    from edgespec.server.engine_kv import KVPool, SlotKV

    pool = KVPool(L, H, D, slots=2, slot_tokens=64, dtype=torch.float32, device=torch.device("cpu"))
    slot = SlotKV(pool)
    s = slot.ensure_slot()
    n = len(source)
    with torch.inference_mode():
        for i, layer in enumerate(source.cache.layers):
            pool.kv[i, 0, s, :, :n] = layer.keys[0]
            pool.kv[i, 1, s, :, :n] = layer.values[0]
    slot.length = n
    return slot


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
    assert slot.nbytes == slot.pool.slot_bytes  # a slot is reserved whole
    assert torch.equal(slot.layer_kv(0, 4), dynamic.layer_kv(0, 4))


def test_a_slot_goes_back_to_the_pool_on_close_or_when_dropped():
    from edgespec.server.engine_kv import KVPool, SlotKV

    pool = KVPool(L, H, D, slots=2, slot_tokens=8, dtype=torch.float32, device=torch.device("cpu"), wait_s=0.05)
    a, b = SlotKV(pool), SlotKV(pool)
    a.reserve()
    b.reserve()
    assert pool.free == 0
    a.close()
    assert pool.free == 1
    a.close()  # twice is harmless
    assert pool.free == 1
    del b
    assert pool.free == 2
