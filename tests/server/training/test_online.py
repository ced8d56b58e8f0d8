"""Training with --features-from target (online.py): the target's features computed while training."""
from __future__ import annotations

import json

import pytest
import torch

from support.drafters import SPECIAL_IDS, train_config
from edgespec.server.training.fit import build_recipe
from edgespec.server.training.online import TargetFeatures
from edgespec.server.training.trainer import Trainer

pytestmark = pytest.mark.slow  # trains drafters


@pytest.fixture(scope="module")
def online(target_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("online-data")
    rows = [{"id": f"text:{i}", "kind": "text", "split": "val" if i % 4 == 3 else "train",
             "prompt": ("def f%d(x):\n    return x * %d + 1\n" % (i, i)) * (2 + i % 3), "response": ""}
            for i in range(8)]
    (data / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return TargetFeatures(str(target_dir), data, max_len=64, tli_depths=(0, 1), device="cpu", dtype="float32")


def test_loaded_features_are_ordinary_tensors(online):
    """The target runs under inference mode; what reaches the trainer must not be an inference tensor,
    which autograd refuses to save for backward (EAGLE's features are its input and its loss target)."""
    seq = online.load(online.split("train")[0], ("hidden", "kv", "act1"))
    for t in (seq.hidden, seq.kv, seq.acts[1]):
        assert not t.is_inference()


@pytest.mark.parametrize("kind,tli", [("eagle", 0), ("moa", 1)])
def test_a_drafter_trains_on_features_from_the_target(kind, tli, online, tmp_path):
    rec = build_recipe(kind, online.loaded.model, online, tli=tli, width=32, heads=4, special_ids=SPECIAL_IDS)
    trainer = Trainer(rec, online, tmp_path, train_config(steps=3, eval_every=3, batch_tokens=96, window=48))
    before = {k: v.detach().clone() for k, v in rec.trainable()[next(iter(rec.trainable()))].state_dict().items()}
    trainer.fit()
    assert [r["step"] for r in trainer.history] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in trainer.history)
    assert "val/mean_accepted" in trainer.history[-1]
    after = rec.trainable()[next(iter(rec.trainable()))].state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight moved: nothing was trained"
