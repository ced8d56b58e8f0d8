"""The training loop, the same for every recipe.

Batches are windows of stored sequences up to ``batch_tokens`` tokens; losses add up
as weighted sums (``losses.Term``) so each token counts once however the batch is cut.
Every ``save_every`` steps the run folder gets ``checkpoint.pt`` (trainable weights,
optimizer, step, RNG), written atomically: a run started again with the same folder
resumes from it. Validation logs per-position acceptance. Device placement, gradient
sync across processes and mixed precision go through ``accelerate`` when it is
installed (``accelerate launch`` / ``torchrun`` on GPUs), else plain torch.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .features import FeatureStore
from .losses import Acceptance
from .recipe import Recipe, sequence_loss, total_loss

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000  # optimizer steps in all
    lr: float = 3e-4  # peak learning rate (AdamW)
    warmup: int = 20  # linear warm-up steps, then cosine decay to lr/10
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    grad_clip: float = 0.5  # max global gradient norm
    batch_tokens: int = 2048  # tokens per optimizer step (summed over windows)
    window: int = 512  # longest window cut from one sequence (random start)
    eval_every: int = 100  # steps between validation passes (and at the end)
    eval_depth: int = 6  # draft positions whose acceptance is logged
    eval_sequences: int = 32  # validation sequences per pass (the first ones, for comparable numbers)
    save_every: int = 100  # steps between checkpoints (and at the end)
    seed: int = 0  # data order, windows, noise
    max_wall_s: float = 0.0  # stop (validate, save) once this run has trained this long; 0 = no limit


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class Trainer:
    def __init__(self, recipe: Recipe, store: FeatureStore, run_dir: str | Path, config: TrainConfig = TrainConfig(),
                 device: str | torch.device | None = None):
        self.recipe, self.store, self.config = recipe, store, config
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.train_files = store.split("train")
        self.val_files = store.split("val")[:config.eval_sequences]
        if not self.train_files:
            raise ValueError(f"feature store {store.path} has no training sequences")
        self.accel = _accelerator()
        self.device = torch.device(device or "cpu") if self.accel is None else self.accel.device
        for m in [*recipe.trainable().values(), getattr(recipe, "parts", None)]:
            if m is not None:
                m.to(self.device)
        self.params = [p for m in recipe.trainable().values() for p in m.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay)
        self.step = 0
        rank = 0 if self.accel is None else self.accel.process_index
        self.gen = torch.Generator().manual_seed(config.seed + 1000 * rank)
        self._cache: dict[Path, object] = {}
        self.history: list[dict] = []

    # -- checkpoints -----------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        state = {"step": self.step, "optimizer": self.opt.state_dict(), "rng": self.gen.get_state(),
                 "modules": {k: m.state_dict() for k, m in self.recipe.trainable().items()},
                 "config": asdict(self.config)}
        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_path)

    def resume(self) -> bool:
        if not self.checkpoint_path.exists():
            return False
        state = torch.load(self.checkpoint_path, weights_only=False)
        for k, m in self.recipe.trainable().items():
            m.load_state_dict(state["modules"][k])
        self.opt.load_state_dict(state["optimizer"])
        self.gen.set_state(state["rng"])
        self.step = state["step"]
        log.info("resumed from %s at step %d", self.checkpoint_path, self.step)
        return True

    # -- data ------------------------------------------------------------------------------------
    def _load(self, path: Path):
        # Decoded sequences stay in memory: features are read once, reused every epoch.
        if path not in self._cache:
            seq = self.store.load(path, self.recipe.feature_names).to(self.device)
            if seq.kv is not None:  # the largest array (L * 2*E_kv a token): half the memory
                seq.kv = seq.kv.half()
            self._cache[path] = seq
        return self._cache[path]

    def _batch(self):
        """Windows (seq, start, end) adding up to about batch_tokens tokens."""
        out, tokens, draws = [], 0, 0
        while tokens < self.config.batch_tokens:
            draws += 1
            if draws > 100 * len(self.train_files):
                raise ValueError(f"no training sequence of {self.store.path} has tokens to learn (loss mask)")
            i = int(torch.randint(len(self.train_files), (1,), generator=self.gen))
            seq = self._load(self.train_files[i])
            n = seq.tokens.shape[0]
            length = min(n, self.config.window)
            start = int(torch.randint(0, n - length + 1, (1,), generator=self.gen))
            if seq.loss_mask[start + 1:start + length].sum() == 0:
                continue
            out.append((seq, start, start + length))
            tokens += length
        return out

    # -- loop ------------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        for m in self.recipe.trainable().values():
            m.train()
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step, self.config)
        terms = None
        for seq, start, end in self._batch():
            t = sequence_loss(self.recipe, self.recipe.forward(seq, start, end, self.gen))
            terms = t if terms is None else {k: terms[k] + t[k] for k in t}
        loss = total_loss(self.recipe, terms)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.accel is not None:  # data-parallel: every process drew its own windows; average grads
            for p in self.params:
                if p.grad is not None:
                    p.grad = self.accel.reduce(p.grad, reduction="mean")
        torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)
        self.opt.step()
        self.step += 1
        return {"loss": loss.item(), **{f"loss/{k}": v.mean().item() for k, v in terms.items()}}

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        for m in self.recipe.trainable().values():
            m.eval()
        acc = Acceptance(0, [])
        terms = None
        gen = torch.Generator().manual_seed(1234)  # the same noise and bounds at every pass
        for path in self.val_files:
            seq = self._load(path)
            acc = acc + self.recipe.acceptance(seq, self.config.eval_depth)
            end = min(seq.tokens.shape[0], self.config.window)
            t = sequence_loss(self.recipe, self.recipe.forward(seq, 0, end, gen))
            terms = t if terms is None else {k: terms[k] + t[k] for k in t}
        out = {"val/chains": acc.chains, "val/mean_accepted": acc.mean_length()}
        out.update({f"val/accept@{k + 1}": r for k, r in enumerate(acc.rates())})
        if terms:
            out["val/loss"] = float(total_loss(self.recipe, terms))
        return out

    def fit(self) -> list[dict]:
        from tqdm import tqdm

        self.resume()
        cfg = self.config
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"train {self.recipe.kind}", mininterval=5)
        t0 = time.perf_counter()
        while self.step < cfg.steps:
            row = {"step": self.step + 1, **self.train_step()}
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.4f}")
            out_of_time = bool(cfg.max_wall_s) and time.perf_counter() - t0 >= cfg.max_wall_s
            last = self.step == cfg.steps or out_of_time
            if self.val_files and (self.step % cfg.eval_every == 0 or last):
                row.update(self.validate())
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            self._log(row)
            if (self.step % cfg.save_every == 0 or last) and self._main:
                self.save_checkpoint()
            if out_of_time:
                log.info("stopping at step %d of %d: the wall-clock budget of %.0f s is spent", self.step, cfg.steps,
                         cfg.max_wall_s)
                break
        bar.close()
        return self.history

    @property
    def _main(self) -> bool:
        return self.accel is None or self.accel.is_main_process

    def _log(self, row: dict) -> None:
        if not self._main:
            return
        self.history.append(row)
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        if "val/chains" in row or row["step"] % 10 == 0 or row["step"] == 1:
            log.info(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


def _accelerator():
    """An accelerate.Accelerator when running under a multi-process launcher, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    from accelerate import Accelerator

    return Accelerator()
