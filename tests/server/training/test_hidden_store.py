"""A hidden-only feature store (``--contents hidden``): the LM-head input alone, for EAGLE-like drafters."""
from __future__ import annotations

import json

import pytest
import torch

from support.drafters import TARGET, target, target_dir  # noqa: F401 (fixtures)
from edgespec.server.training.extraction import ExtractConfig, extract_sharded
from edgespec.server.training.features import FeatureStore
from edgespec.server.training.fit import build_recipe

ROWS = [{"id": f"text:{i}", "kind": "text", "split": "val" if i % 5 == 2 else "train",
         "prompt": ("def g%d(y):\n    return y + %d\n" % (i, i)) * (2 + i % 3), "response": ""} for i in range(12)]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return d


def extract(target_dir, data_dir, out, contents):
    cfg = ExtractConfig(max_len=64, batch_tokens=96, shard_tokens=128, contents=contents)
    return FeatureStore(extract_sharded(str(target_dir), data_dir, out, cfg, device="cpu", dtype="float32"))


def test_a_hidden_store_holds_the_full_stores_hidden_and_nothing_else(target_dir, data_dir, tmp_path):
    full = extract(target_dir, data_dir, tmp_path / "full", "full")
    hidden = extract(target_dir, data_dir, tmp_path / "hidden", "hidden")
    assert hidden.meta["contents"] == "hidden" and hidden.meta["tli_depths"] == []
    assert [(f.index, f.tokens) for f in hidden.files] == [(f.index, f.tokens) for f in full.files]
    for a, b in zip(full.files, hidden.files):
        seq_full = full.load(a, ("hidden", "kv", "act0"))
        seq = hidden.load(b, ("hidden", "kv", "act0"))
        assert seq.kv is None and seq.acts == {}
        assert torch.equal(seq.tokens, seq_full.tokens)
        torch.testing.assert_close(seq.hidden, seq_full.hidden, atol=0, rtol=0)  # the same forward, the same codec
    on_disk = lambda store: sum(p.stat().st_size for p in (store.path / "shards").glob("*.npz"))  # noqa: E731
    assert on_disk(hidden) < on_disk(full) / 3


def test_resuming_a_hidden_store_as_a_full_one_is_refused(target_dir, data_dir, tmp_path):
    extract(target_dir, data_dir, tmp_path / "s", "hidden")
    with pytest.raises(ValueError, match="contents"):
        extract(target_dir, data_dir, tmp_path / "s", "full")


def test_eagle_trains_on_a_hidden_store_and_moa_is_refused_before_training(target, target_dir, data_dir,
                                                                           tmp_path):
    store = extract(target_dir, data_dir, tmp_path / "s", "hidden")
    eagle = build_recipe("eagle+hass", target.model, store, width=32, heads=4)
    seq = store.load(store.split("train")[0], eagle.feature_names)
    assert eagle.forward(seq, 0, seq.tokens.shape[0], torch.Generator().manual_seed(0))["n"] > 0
    for kind in ("moa", "moa+hass"):
        with pytest.raises(ValueError, match="--contents full"):
            build_recipe(kind, target.model, store, tli=1, width=32, heads=4)


def test_several_stores_train_as_one(target, target_dir, data_dir, tmp_path):
    from support.drafters import train_config

    from edgespec.server.training.features import StoreUnion, open_stores
    from edgespec.server.training.trainer import Trainer

    hidden = extract(target_dir, data_dir, tmp_path / "a", "hidden")
    full = extract(target_dir, data_dir, tmp_path / "b", "full")
    union = open_stores([hidden.path, full.path])
    assert isinstance(union, StoreUnion) and isinstance(open_stores([hidden.path]), FeatureStore)
    assert union.meta["contents"] == "hidden" and union.meta["tli_depths"] == []
    assert union.split("train") == hidden.split("train") + full.split("train")
    assert union.tokens("val") == hidden.tokens("val") + full.tokens("val")
    with pytest.raises(ValueError, match="--contents full"):
        build_recipe("moa", target.model, union, tli=1, width=32, heads=4)
    trainer = Trainer(build_recipe("eagle", target.model, union, width=32, heads=4), union, tmp_path / "run",
                      train_config(steps=2))
    trainer.fit()
    assert trainer.step == 2 and trainer.tokens_seen > 0


def test_a_growing_data_set_extracts_as_one_run_over_all_its_rows(target_dir, tmp_path):
    """Rows appended between runs (the target still answering beside): --growing leaves the last, unfilled
    shard for later, so the store ends as one run over every row makes it, no row skipped."""
    def write(d, n):
        d.mkdir(exist_ok=True)
        (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:n]))

    def run(d, out, growing):
        cfg = ExtractConfig(max_len=64, batch_tokens=96, shard_tokens=128, contents="hidden", growing=growing)
        return FeatureStore(extract_sharded(str(target_dir), d, out, cfg, device="cpu", dtype="float32"))

    grown = tmp_path / "grown"
    write(grown, 7)
    first = run(grown, tmp_path / "a", growing=True)
    write(grown, 12)
    run(grown, tmp_path / "a", growing=True)
    grown_store = run(grown, tmp_path / "a", growing=False)  # the data job is done: the last shard too
    write(tmp_path / "whole", 12)
    whole = run(tmp_path / "whole", tmp_path / "b", growing=False)
    assert 0 < len(first.files) < len(whole.files)
    assert [(f.path.name, f.index, f.tokens) for f in grown_store.files] == \
        [(f.path.name, f.index, f.tokens) for f in whole.files]
