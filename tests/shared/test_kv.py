"""shared.kv: crop, keep-rows, per-layer K|V and bytes, the same on a DynamicCache and on paged pool blocks; and
no deprecated transformers argument on any path that hands a model its KV cache.

transformers 5.24 warns (through its logger, once per process, and the warning reaches the
JSON logs) on ``past_key_values=`` and removes it in 5.40. Each path runs here with Python
warnings as errors and transformers' once-only log cache cleared, so a warning fails the test
whichever test ran first.
"""
from __future__ import annotations

import logging
import random
import warnings

import pytest
import torch

from edgespec.client.drafters.base import DraftRequest
from edgespec.client.drafters.independent import IndependentConfig, IndependentDrafter
from edgespec.server.engine.choice import build_engine
from edgespec.server.scheduler import ModelScheduler
from edgespec.server.session import VerifierSession
from edgespec.server.target import TargetModel
from edgespec.shared import kv
from edgespec.shared.drafters.blocks import causal_mask
from edgespec.shared.drafters.target_parts import TargetParts
from edgespec.shared.models.loading import load_model
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.session_settings import SessionSettings
from edgespec.shared.tree import ROOT, DraftTree

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


# ------------------------------------------------------------ the cache's argument name
@pytest.fixture
def strict(caplog):
    """Warnings raise; transformers' log records are collected (its warning_once cache cleared first)."""
    logging.Logger.warning_once.cache_clear()  # transformers adds this cached method to every Logger
    caplog.set_level(logging.WARNING, logger="transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield caplog
    deprecated = [r.getMessage() for r in caplog.records if "deprecat" in r.getMessage().lower()]
    assert not deprecated, deprecated


@pytest.fixture(scope="module")
def target(tiny_model_dir) -> TargetModel:
    return TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32"))


@pytest.mark.parametrize("engine", ["generic", "batched"])
def test_a_verification_uses_no_deprecated_argument(strict, target, engine):
    scheduler = ModelScheduler(build_engine(target, engine))
    session = VerifierSession(SessionSettings("s", SamplingSettings(), 0), target, scheduler, max_context_tokens=128)
    session.open([1, 2, 3, 4, 5], None)
    session.verify(1, len(session.committed), DraftTree((7, 8, 9), (ROOT, 0, 0)))
    assert len(session.committed) >= 7


def test_the_independent_drafter_uses_no_deprecated_argument(strict, tiny_model):
    drafter = IndependentDrafter.from_model(tiny_model, IndependentConfig(int8_weights=False))
    tree = drafter.propose(DraftRequest(committed=[1, 2, 3, 4], max_nodes=8, max_depth=4))
    assert len(tree) > 0


def test_target_layers_and_the_returned_cache_use_no_deprecated_argument(strict, target):
    parts = TargetParts(target.model, tli=2, dtype=torch.float32)
    x = torch.randn(6, target.hidden_size)
    out, layers_kv = parts.run_layers(x, torch.arange(6), causal_mask(6))
    assert out.shape == (6, target.hidden_size) and len(layers_kv) == 2
    with torch.no_grad():
        returned = kv.output_cache(target.model.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True))
    assert returned.get_seq_length() == 3


def test_the_cache_argument_is_the_name_the_installed_transformers_takes(target):
    import inspect

    params = inspect.signature(type(target.model.model).forward).parameters
    assert kv.cache_kwarg(target.model.model) in params
