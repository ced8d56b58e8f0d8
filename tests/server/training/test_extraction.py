"""Batched, sharded, resumable feature extraction (extraction.py) on the tiny target."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from support.drafters import TARGET
from edgespec.server.training.extraction import (ExtractConfig, Sequence, batch_features, extract_sharded,
                                                 plan_batches, plan_shards, shard_path)
from edgespec.server.training.features import FeatureStore, target_features


def rows(n: int) -> list[dict]:
    # Texts of different lengths, so forwards pad and shards hold several sequences.
    return [{"id": f"text:{i}", "kind": "text", "split": "val" if i % 7 == 3 else "train",
             "prompt": ("def f%d(x):\n    return x * %d\n" % (i, i)) * (1 + i % 5), "response": ""}
            for i in range(n)]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(40)))
    return d


def test_shards_and_batches_are_planned_from_the_order_alone():
    seqs = [Sequence(str(i), "train", [1] * n, [1] * n) for i, n in enumerate([5, 9, 3, 8, 8, 2])]
    shards = plan_shards(seqs, 12)
    assert [[s.id for s in sh] for sh in shards] == [["0", "1"], ["2", "3", "4"], ["5"]]
    batches = plan_batches(seqs, 18)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert all(max(len(seqs[i].ids) for i in b) * len(b) <= 18 for b in batches)
    assert batches[0] == [1, 3]  # longest first: 9 and 8 pad to 18


def test_a_padded_batch_gives_each_sequence_its_own_features(target):
    ids = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33, 34, 35]]
    batched = batch_features(target.model, ids, (0, 1, 3), pad_id=0)
    for seq, got in zip(ids, batched):
        alone = target_features(target.model, seq, (0, 1, 3))
        assert set(got) == set(alone) == {"hidden", "kv", "act0", "act1", "act3"}
        for name in alone:
            assert got[name].shape == alone[name].shape
            torch.testing.assert_close(got[name], alone[name], atol=1e-4, rtol=1e-4)


def test_the_sharded_store_reads_back_every_sequence(target_dir, data_dir, tmp_path):
    cfg = ExtractConfig(max_len=64, batch_tokens=96, shard_tokens=128)
    store = FeatureStore(extract_sharded(str(target_dir), data_dir, tmp_path / "store", cfg, device="cpu",
                                         dtype="float32"))
    assert len(list((tmp_path / "store" / "shards").glob("*.npz"))) > 3
    assert len(store.files) == 40
    assert {store.load(f, ()).id for f in store.split("val")} == {f"text:{i}" for i in range(40) if i % 7 == 3}
    seq = store.load(store.split("train")[0], ("hidden", "kv", "act0", "act1", "act3"))
    assert seq.hidden.shape == (seq.tokens.numel(), TARGET.hidden_size)
    assert seq.kv.shape[:2] == (seq.tokens.numel(), TARGET.num_layers) and set(seq.acts) == {0, 1, 3}
    assert store.tokens("train") == sum(store.load(f, ()).tokens.numel() for f in store.split("train"))


@pytest.mark.slow
def test_a_killed_extraction_resumes_to_the_same_store(target_dir, data_dir, tmp_path):
    """SIGKILL a real `edgespec train features` once its first shard is on disk, run it again, and
    compare with a run never stopped: the same sequences with the same features."""
    def command(out):
        return [sys.executable, "-m", "edgespec.server.training.cli", "features", "--target", str(target_dir),
                "--data", str(data_dir), "--out", str(out), "--max-len", "64", "--batch-tokens", "64",
                "--shard-tokens", "64", "--device", "cpu", "--dtype", "float32", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command(tmp_path / "straight"), check=True, env=env, capture_output=True)
    n_shards = len(list((tmp_path / "straight" / "shards").glob("shard-*.npz")))
    cut = tmp_path / "cut"
    proc = subprocess.Popen(command(cut), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not shard_path(cut, 0).exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list((cut / "shards").glob("shard-*.npz")))
    assert 0 < written < n_shards, f"the kill landed after {written} of {n_shards} shards: not mid-run"
    subprocess.run(command(cut), check=True, env=env, capture_output=True)
    a, b = FeatureStore(tmp_path / "straight"), FeatureStore(cut)
    assert [f.path.name for f in a.files] == [f.path.name for f in b.files]
    names = ("hidden", "kv", "act0", "act1", "act3")
    for fa, fb in zip(a.files, b.files):
        sa, sb = a.load(fa, names), b.load(fb, names)
        assert sa.id == sb.id and torch.equal(sa.tokens, sb.tokens) and torch.equal(sa.loss_mask, sb.loss_mask)
        for name in ("hidden", "kv"):
            assert torch.equal(getattr(sa, name), getattr(sb, name))
        assert all(torch.equal(sa.acts[k], sb.acts[k]) for k in sa.acts)


def test_resuming_with_other_shards_is_refused(target_dir, data_dir, tmp_path):
    extract_sharded(str(target_dir), data_dir, tmp_path / "s", ExtractConfig(max_len=32, shard_tokens=64, limit=4),
                    device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="shards of 64 tokens"):
        extract_sharded(str(target_dir), data_dir, tmp_path / "s", ExtractConfig(max_len=32, shard_tokens=128),
                        device="cpu", dtype="float32")


def test_resuming_in_another_dtype_is_refused(target_dir, data_dir, tmp_path):
    """A store is one dtype's features: bf16 shards after float32 ones would mix two targets' numbers."""
    cfg = ExtractConfig(max_len=32, shard_tokens=64, limit=4)
    extract_sharded(str(target_dir), data_dir, tmp_path / "s", cfg, device="cpu", dtype="float32")
    before = sorted(p.name for p in (tmp_path / "s" / "shards").iterdir())
    with pytest.raises(ValueError, match=r"dtype='torch.float32'.*'torch.bfloat16'"):
        extract_sharded(str(target_dir), data_dir, tmp_path / "s", ExtractConfig(max_len=32, shard_tokens=64),
                        device="cpu", dtype="bfloat16")
    assert sorted(p.name for p in (tmp_path / "s" / "shards").iterdir()) == before
    assert json.loads((tmp_path / "s" / "store.json").read_text())["dtype"] == "torch.float32"
    extract_sharded(str(target_dir), data_dir, tmp_path / "s", ExtractConfig(max_len=32, shard_tokens=64),
                    device="cpu", dtype="float32")  # the same dtype resumes


def within_half_a_step(exact: torch.Tensor, stored: torch.Tensor, row: int) -> bool:
    """Every stored value within half an int8 step of its row (rows of ``row`` channels, as the store cuts
    them): the most an INT8_OUTLIER round trip may move a value (an outlier channel's float16 moves it less),
    plus float noise where the two come from different forwards (batched and padded, or alone)."""
    x, y = exact.reshape(-1, row), stored.reshape(-1, row)
    absmax = x.abs().amax(-1, keepdim=True)
    return bool(((x - y).abs() <= absmax / 254 + 1e-4 * absmax + 1e-6).all())


def kv_store(tmp_path, kv: torch.Tensor, arrays=None):
    """A one-sequence store file holding kv [n, L, 2*E_kv] as the store writes it (or ``arrays``)."""
    from edgespec.server.training.features import save_npz, sequence_arrays

    n = kv.shape[0]
    arrays = arrays or sequence_arrays("", "x", "train", list(range(n)), [1] * n, {"kv": kv})
    path = tmp_path / "x.npz"
    save_npz(path, arrays)
    return FeatureStore.load(path, ("kv",)).kv


def test_k_and_v_are_quantized_apart(tmp_path):
    """Keys have channels far larger than any value (the 1.5B's first layer: ~190x): sharing a scale
    with them left V a few int8 levels. Each token's K and V of each layer have a scale of their own."""
    g = torch.Generator().manual_seed(0)
    n, L, e = 12, 3, 64
    k = torch.randn(n, L, e, generator=g) * 0.5
    k[..., 5] *= 400  # a key channel as large as Qwen's
    v = torch.randn(n, L, e, generator=g) * 0.5
    back = kv_store(tmp_path, torch.cat([k, v], -1))
    assert back.shape == (n, L, 2 * e)
    rel = lambda a, b: float((a - b).norm() / a.norm())  # noqa: E731
    assert rel(v, back[..., e:]) < 0.01 and rel(k, back[..., :e]) < 0.01
    assert within_half_a_step(torch.cat([k, v], -1), back, e)


def test_a_store_of_the_older_kv_layout_still_reads(tmp_path):
    """Stores written before K and V were quantized apart hold kv as [n, L, 2*E_kv] frames."""
    from edgespec.server.training.features import CODEC
    import numpy as np

    kv = torch.randn(6, 2, 16, generator=torch.Generator().manual_seed(1))
    old = {"tokens": np.arange(6, dtype=np.int32), "loss_mask": np.ones(6, np.uint8),
           "meta": np.frombuffer(json.dumps({"id": "x", "split": "train"}).encode(), np.uint8),
           "kv": np.frombuffer(CODEC.encode(kv), np.uint8)}
    back = kv_store(tmp_path, kv, old)
    assert back.shape == kv.shape and within_half_a_step(kv, back, 16)


def test_features_from_the_target_during_training(target_dir, data_dir, tmp_path):
    """--features-from target: the same sequences and splits as a store of the same data, features
    equal to the stored ones up to their int8 rounding, and a trainer runs on it without keeping them."""
    from support.drafters import train_config
    from edgespec.server.training.fit import build_recipe
    from edgespec.server.training.online import TargetFeatures
    from edgespec.server.training.trainer import Trainer

    online = TargetFeatures(str(target_dir), data_dir, max_len=64, tli_depths=(0, 1), device="cpu", dtype="float32")
    stored = FeatureStore(extract_sharded(str(target_dir), data_dir, tmp_path / "store",
                                          ExtractConfig(max_len=64, tli_depths=(0, 1)), device="cpu", dtype="float32"))
    assert [f.split for f in online.files] == [f.split for f in stored.files]
    names = ("hidden", "kv", "act1")
    a, b = online.load(online.split("train")[2], names), stored.load(stored.split("train")[2], names)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.loss_mask, b.loss_mask) and set(a.acts) == {1}
    e, e_kv = a.hidden.shape[-1], a.kv.shape[-1] // 2
    pairs = (("hidden", a.hidden, b.hidden, e), ("kv", a.kv, b.kv, e_kv), ("act1", a.acts[1], b.acts[1], e))
    for name, x, y, row in pairs:
        assert within_half_a_step(x, y, row), name
    rec = build_recipe("moa", str(target_dir), online, tli=1, width=32, heads=4, special_ids=(258,))
    trainer = Trainer(rec, online, tmp_path / "run", train_config(steps=3, eval_every=3))
    trainer.fit()
    assert len(trainer.history) == 3 and "val/mean_accepted" in trainer.history[-1] and not trainer._cache
