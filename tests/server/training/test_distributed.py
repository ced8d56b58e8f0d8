"""Data-parallel training: `torchrun --nproc-per-node 2 ... edgespec train fit` (2 gloo ranks on the
CPU) follows the loss curve of one process (`--nproc-per-node 1`) with the same global batch, and gradient accumulation
does too. Tolerance: 1e-4 relative per step (the only difference is the order floats are summed in:
two ranks' gradients added after the backward passes instead of inside one)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from support.drafters import train_config
from edgespec.server.training.fit import build_recipe
from edgespec.server.training.trainer import Trainer

TOLERANCE = 1e-4


def fit_command(target_dir, store, out, kind: str, extra: list[str]) -> list[str]:
    return ["-m", "edgespec.server.training.cli", "fit", "--kind", kind, "--target", str(target_dir),
            "--features", str(store.path), "--out", str(out), "--tli", "1", "--width", "32", "--heads", "4",
            "--steps", "6", "--batch-tokens", "256", "--window", "64", "--lr", "3e-3", "--eval-every", "100",
            "--eval-sequences", "2", "--save-every", "100", "--threads", "1", "--device", "cpu", *extra]


def losses(run) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["moa"])
def test_two_gloo_ranks_follow_one_rank(kind, target_dir, store, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    # One process under the launcher too: a plain run keeps its older random stream (trainer.py).
    one = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                          *fit_command(target_dir, store, tmp_path / "one", kind, [])],
                         env=env, capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          *fit_command(target_dir, store, tmp_path / "two", kind, ["--grad-accum", "2"])],
                         env=env, capture_output=True, text=True, timeout=120)
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == len(b) == 6
    assert a[-1] < a[0]  # it trains at all
    for step, (x, y) in enumerate(zip(a, b), 1):
        assert abs(x - y) <= TOLERANCE * abs(x), f"step {step}: 1 rank {x}, 2 ranks {y}"
    card = json.loads((tmp_path / "two" / "card.json").read_text())
    assert card["training"]["processes"] == 2
    assert (tmp_path / "two" / "log.rank1.txt").exists()


def test_gradient_accumulation_keeps_the_curve(target, store, tmp_path):
    runs = []
    for accum in (1, 3):
        rec = build_recipe("moa", target.model, store, tli=1, width=32, heads=4, special_ids=(258,))
        cfg = train_config(steps=4, grad_accum=accum, batch_tokens=256, window_rng="per-window")
        trainer = Trainer(rec, store, tmp_path / str(accum), cfg)
        trainer.fit()
        runs.append([r["loss"] for r in trainer.history])
    torch.testing.assert_close(torch.tensor(runs[1]), torch.tensor(runs[0]), rtol=TOLERANCE, atol=0)
