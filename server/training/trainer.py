"""The training loop, the same for every recipe.

A step's global batch is windows of stored sequences adding up to ``batch_tokens`` tokens,
drawn from a generator every process seeds alike; under ``torchrun`` (``distributed.py``)
process r takes windows r, r+N, ... and splits them into ``grad_accum`` micro-batches, each
backward on its own. Each micro-batch's loss is its own weighted mean scaled by its share of
the step's learned tokens, so summed over micro-batches and processes the gradient is the one
of the whole batch at once: N processes follow the curve of one (up to float summation order)
for any recipe whose term weights are its learned-token mask, as EAGLE's and MoA's are. A
window's own randomness (noise, MoA's step bounds) comes from a generator seeded by (seed,
step, window), so it does not depend on which process draws it (``window_rng``; a plain
single process keeps the one shared stream earlier runs used, so their commands still
reproduce them).

Training sequences are decoded from the store when drawn and kept in a cache of at most
``cache_mb`` (least recently used dropped first), so a store larger than memory streams.

Every ``save_every`` steps the run folder gets ``checkpoint.pt`` (trainable weights, optimizer,
step, RNG, the learning-rate schedule's horizon), written atomically: a run started again with the
same folder resumes from it, on the schedule it started with. A SIGTERM (``kill PID``: how a
background segment is ended early) stops the run like a spent wall-clock budget: the step under way
finishes, then the checkpoint, the card and the drafter's files are written as at any segment's end.
Validation (every ``eval_every`` steps, on rank 0) logs per-position acceptance. On GPUs the
forward runs under bf16 autocast. Progress: a bar with tokens/s and time left on a terminal,
plain log lines otherwise.
"""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path

import torch

from . import distributed
from .features import FeatureStore, StoredSequence
from .losses import Acceptance
from .recipe import Recipe, sequence_loss, total_loss
from .train_config import TrainConfig

log = logging.getLogger(__name__)


def lr_at(step: int, cfg: TrainConfig, horizon: int | None = None, cooldown_from: int | None = None) -> float:
    """Linear warm-up, then a cosine from lr down to lr/10 at step ``horizon`` (default cfg.steps), and
    lr/10 after it. From step ``cooldown_from`` on (with cfg.cooldown), that schedule's rate at
    ``cooldown_from`` falls linearly to 0 over cfg.cooldown steps: the last step's rate is 1/cooldown of it."""
    if cooldown_from is not None and cfg.cooldown:
        done = min(step - cooldown_from, cfg.cooldown)
        return lr_at(cooldown_from, cfg, horizon) * (1 - done / cfg.cooldown)
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, (cfg.steps if horizon is None else horizon) - cfg.warmup)
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
        if config.grad_accum < 1:
            raise ValueError(f"grad_accum must be at least 1, got {config.grad_accum}")
        self.world = distributed.init(device)
        self.device = self.world.device
        self.bf16 = config.amp == "bf16" or (config.amp == "auto" and self.device.type == "cuda")  # autocast
        for m in [*recipe.trainable().values(), getattr(recipe, "parts", None)]:
            if m is not None:
                m.to(self.device)
        self.params = [p for m in recipe.trainable().values() for p in m.parameters() if p.requires_grad]
        distributed.broadcast_params(self.params)
        self.opt = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay)
        self.step = 0
        # The step the cosine reaches its floor: this run's steps, or, resumed, what the first run planned
        # (checkpoint.pt keeps it), so that a larger --steps adds steps instead of re-stretching the
        # learning rates of those already planned.
        self.horizon = config.steps
        # The step a cooldown began at (checkpoint.pt keeps it): a resumed cooldown goes on where it was.
        self.cooldown_from: int | None = None
        # The same on every process: they draw the same global batch and each takes its share.
        self.gen = torch.Generator().manual_seed(config.seed)
        # Decoded training sequences, within a byte budget (--cache-mb): a store larger than memory is
        # streamed, the most recently used sequences kept. Validation's few sequences stay decoded.
        self._cache = SequenceCache(int(config.cache_mb * 2**20))
        self._val_cache: dict[object, StoredSequence] = {}
        self._light: dict[object, torch.Tensor] = {}  # loss masks only (n bytes a sequence), never features
        self.history: list[dict] = []
        self.tokens_seen = 0
        if config.window_rng not in ("auto", "per-window", "shared"):
            raise ValueError(f"window_rng must be auto, per-window or shared, got {config.window_rng!r}")
        launched = "WORLD_SIZE" in os.environ or config.grad_accum > 1
        self.per_window = config.window_rng == "per-window" or (config.window_rng == "auto" and launched)
        if self.world.size > 1 and not self.per_window:
            raise ValueError("several processes need window_rng per-window (or auto)")

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        state = {"step": self.step, "tokens": self.tokens_seen, "optimizer": self.opt.state_dict(),
                 "rng": self.gen.get_state(), "schedule_steps": self.horizon,
                 "cooldown_from": self.cooldown_from,
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
        self.tokens_seen = state.get("tokens", 0)
        # Checkpoints from before the horizon was recorded: the steps of the run that wrote them.
        self.horizon = int(state.get("schedule_steps", state.get("config", {}).get("steps", self.config.steps)))
        self.cooldown_from = state.get("cooldown_from")
        if self.cooldown_from is not None and not self.config.cooldown:
            raise ValueError(f"{self.run_dir} is a cooldown that began at step {self.cooldown_from}: go on with the "
                             f"--cooldown it was started with, or branch the steady run again (--branch-from)")
        log.info("resumed from %s at step %d", self.checkpoint_path, self.step)
        if self.horizon != self.config.steps:
            log.info("the run now goes to %d steps on the learning-rate schedule planned for %d (%s)",
                     self.config.steps, self.horizon,
                     f"from step {self.horizon} on at its floor lr/10" if self.config.steps > self.horizon
                     else "stopping before its end")
        return True

    def _load(self, path, validation: bool = False) -> StoredSequence:
        """A sequence decoded, from the cache when it holds it. Features a target computes on the fly
        (online.py: ``store.cache`` False) are never kept."""
        seq = self._val_cache.get(path) if validation else self._cache.get(path)
        if seq is not None:
            return seq
        seq = self.store.load(path, self.recipe.feature_names).to(self.device)
        if seq.kv is not None:  # the largest array (L * 2*E_kv a token): half the memory
            seq.kv = seq.kv.half()
        if getattr(self.store, "cache", True):
            if validation:
                self._val_cache[path] = seq
            else:
                self._cache.put(path, seq)
        return seq

    def _mask(self, path) -> torch.Tensor:
        """A sequence's loss mask (its length too), without decoding its features: every process
        draws every window of the batch, and only decodes its own."""
        if path not in self._light:
            self._light[path] = self.store.load(path, ()).loss_mask
        return self._light[path]

    def _batch(self):
        """Windows (ref, start, end) adding up to about batch_tokens tokens: the global batch."""
        out, tokens, draws = [], 0, 0
        while tokens < self.config.batch_tokens:
            draws += 1
            if draws > 100 * len(self.train_files):
                raise ValueError(f"no training sequence of {self.store.path} has tokens to learn (loss mask)")
            i = int(torch.randint(len(self.train_files), (1,), generator=self.gen))
            mask = self._mask(self.train_files[i])
            n = mask.shape[0]
            length = min(n, self.config.window)
            start = int(torch.randint(0, n - length + 1, (1,), generator=self.gen))
            if mask[start + 1:start + length].sum() == 0:
                continue
            out.append((self.train_files[i], start, start + length))
            tokens += length
        return out

    def train_step(self) -> dict[str, float]:
        for m in self.recipe.trainable().values():
            m.train()
        lr = lr_at(self.step, self.config, self.horizon, self.cooldown_from)
        for g in self.opt.param_groups:
            g["lr"] = lr
        windows = self._batch()
        learned = lambda w: float(self._mask(w[0])[w[1] + 1:w[2]].sum())  # noqa: E731
        total_learned = sum(learned(w) for w in windows)
        mine = list(enumerate(windows))[self.world.rank::self.world.size]
        k = min(self.config.grad_accum, max(1, len(mine)))
        micro = [mine[j::k] for j in range(k)]
        names = [t.name for t in self.recipe.terms]
        sums = torch.zeros(2 * len(names) + 1, dtype=torch.float64)  # term totals, term weights, loss
        self.opt.zero_grad(set_to_none=True)
        for part in micro:
            if not part:
                continue
            terms = None
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                for idx, (ref, start, end) in part:
                    gen = (torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.step * 4099 + idx)
                           if self.per_window else self.gen)
                    t = sequence_loss(self.recipe, self.recipe.forward(self._load(ref), start, end, gen))
                    terms = t if terms is None else {n: terms[n] + t[n] for n in t}
            share = sum(learned(w) for _, w in part) / total_learned
            loss = total_loss(self.recipe, terms) * share
            loss.backward()
            for i, n in enumerate(names):
                sums[i] += float(terms[n].total.detach())
                sums[len(names) + i] += float(terms[n].weight.detach())
            sums[-1] += float(loss.detach())
        distributed.all_reduce_grads(self.params)
        sums = distributed.all_sum(sums.to(self.device)).cpu()
        torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)
        self.opt.step()
        self.step += 1
        self.tokens_seen += sum(end - start for _, start, end in windows)
        out = {"loss": float(sums[-1]), "lr": lr}
        out.update({f"loss/{n}": float(sums[i] / max(float(sums[len(names) + i]), 1e-9)) for i, n in enumerate(names)})
        return out

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        for m in self.recipe.trainable().values():
            m.eval()
        acc = Acceptance(0, [])
        terms = None
        gen = torch.Generator().manual_seed(1234)  # the same noise and bounds at every pass
        for path in self.val_files:
            seq = self._load(path, validation=True)
            acc = acc + self.recipe.acceptance(seq, self.config.eval_depth)
            end = min(seq.tokens.shape[0], self.config.window)
            t = sequence_loss(self.recipe, self.recipe.forward(seq, 0, end, gen))
            terms = t if terms is None else {k: terms[k] + t[k] for k in t}
        out = {"val/chains": acc.chains, "val/mean_accepted": acc.mean_length()}
        out.update({f"val/accept@{k + 1}": r for k, r in enumerate(acc.rates())})
        if terms:
            out["val/loss"] = float(total_loss(self.recipe, terms))
        return out

    def end_step(self) -> int:
        """The step the run stops at: cfg.steps, or the end of its cooldown (begun now if not yet begun)."""
        if not self.config.cooldown:
            return self.config.steps
        if self.cooldown_from is None:
            self.cooldown_from = self.step
            log.info("cooldown: the learning rate falls from %.3g to 0 over steps %d-%d",
                     lr_at(self.step, self.config, self.horizon), self.step + 1, self.step + self.config.cooldown)
        return self.cooldown_from + self.config.cooldown

    def fit(self) -> list[dict]:
        self.resume()
        cfg = self.config
        end = self.end_step()
        progress = Progress(end, self.step, self.tokens_seen, f"train {self.recipe.kind}", self.world.main,
                            cfg.log_every)
        t0 = time.perf_counter()
        stop = StopRequest()
        try:
            while self.step < end:
                row = {"step": self.step + 1, **self.train_step()}
                out_of_time = bool(cfg.max_wall_s) and time.perf_counter() - t0 >= cfg.max_wall_s
                stopped = stop.agreed(self.device)
                last = self.step == end or out_of_time or stopped
                if self.val_files and self.world.main and (self.step % cfg.eval_every == 0 or last):
                    row.update(self.validate())
                row["wall_s"] = round(time.perf_counter() - t0, 1)
                row["tokens"] = self.tokens_seen
                self._log(row)
                progress.update(self.step, self.tokens_seen, row["loss"])
                if (self.step % cfg.save_every == 0 or last) and self.world.main:
                    self.save_checkpoint()
                # A cooling branch is not a point of the steady run's scaling curve: no snapshots.
                if cfg.snapshot_tokens and self.world.main and self.cooldown_from is None:
                    self.snapshot(row)
                if stopped:
                    log.info("stopping at step %d of %d: asked to (SIGTERM)", self.step, end)
                    break
                if out_of_time:
                    log.info("stopping at step %d of %d: the wall-clock budget of %.0f s is spent", self.step,
                             end, cfg.max_wall_s)
                    break
        finally:
            stop.close()
        progress.close()
        distributed.barrier()
        return self.history

    def snapshot(self, row: dict) -> Path | None:
        """The drafter as it is, in ``snapshots/tokens-T/``, once the tokens seen first pass T (a doubling of
        ``snapshot_tokens``); with the step, tokens seen and the training tokens the store held then."""
        due = snapshot_due(self.tokens_seen, self.config.snapshot_tokens)
        if not due:
            return None
        folder = self.run_dir / "snapshots" / f"tokens-{due}"
        if folder.exists():
            return None
        tmp = folder.with_name(folder.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        files = self.recipe.save_drafter(tmp)
        (tmp / "snapshot.json").write_text(json.dumps({
            "step": self.step, "tokens_seen": self.tokens_seen, "train_tokens": self.store.tokens("train"),
            "train_sequences": len(self.train_files), "kind": self.recipe.kind,
            "files": [str(f.relative_to(tmp)) for f in files],
            **{k: v for k, v in row.items() if k.startswith("val/")}}, indent=1))
        os.replace(tmp, folder)
        log.info("snapshot at %d tokens seen: %s", self.tokens_seen, folder)
        return folder

    def _log(self, row: dict) -> None:
        if not self.world.main:
            return
        self.history.append(row)
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        if "val/chains" in row:
            log.info(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


class StopRequest:
    """SIGTERM while training sets a flag the loop reads after each step, instead of killing the process
    mid-step (which would lose the steps since the last checkpoint and never write the card). Under
    ``torchrun`` the ranks agree on it (a sum over ranks), so none is left waiting in a collective.
    Installed only from the main thread (Python's rule for signal handlers); ``close`` restores the old one."""

    def __init__(self):
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, _signum, _frame) -> None:
        self.requested = True

    def agreed(self, device) -> bool:
        return bool(distributed.all_sum(torch.tensor([float(self.requested)], device=device)).cpu()[0] > 0)

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def snapshot_due(tokens_seen: int, base: int) -> int:
    """The largest base * 2^k not above ``tokens_seen`` (0: below ``base``)."""
    if base <= 0 or tokens_seen < base:
        return 0
    due = base
    while due * 2 <= tokens_seen:
        due *= 2
    return due


def sequence_bytes(seq: StoredSequence) -> int:
    """Bytes of a decoded sequence's tensors."""
    tensors = [seq.tokens, seq.loss_mask, seq.hidden, seq.kv, *seq.acts.values()]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class SequenceCache:
    """Decoded sequences, least recently used evicted first, holding at most ``budget`` bytes.

    A sequence larger than the whole budget is not kept (it would evict everything for one use)."""

    def __init__(self, budget: int):
        if budget < 0:
            raise ValueError(f"the cache budget must be >= 0 bytes, got {budget}")
        self.budget, self.held = budget, 0
        self._seqs: OrderedDict[object, tuple[StoredSequence, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seqs)

    def get(self, key) -> StoredSequence | None:
        if key not in self._seqs:
            return None
        self._seqs.move_to_end(key)
        return self._seqs[key][0]

    def put(self, key, seq: StoredSequence) -> None:
        size = sequence_bytes(seq)
        if key in self._seqs or size > self.budget:
            return
        while self.held + size > self.budget:
            _, (_, old) = self._seqs.popitem(last=False)
            self.held -= old
        self._seqs[key] = (seq, size)
        self.held += size


class Progress:
    """Steps, loss, tokens/s and time left: a tqdm bar on a terminal, a log line every ``every``
    steps otherwise (a bar's carriage returns make a log file unreadable). Rank 0 only."""

    def __init__(self, total: int, initial: int, initial_tokens: int, desc: str, enabled: bool, every: int):
        self.total, self.start_step, self.enabled, self.every = total, initial, enabled, max(1, every)
        self.start_tokens = initial_tokens
        self.t0 = time.perf_counter()
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, mininterval=1, unit="step")

    def update(self, step: int, tokens: int, loss: float) -> None:
        if not self.enabled:
            return
        dt = max(time.perf_counter() - self.t0, 1e-9)
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(f"loss {loss:.4f} {(tokens - self.start_tokens) / dt:.0f} tok/s")
        elif step % self.every == 0 or step == self.total or step == self.start_step + 1:
            steps_per_s = (step - self.start_step) / dt
            left = (self.total - step) / steps_per_s if steps_per_s > 0 else float("nan")
            log.info(f"step {step}/{self.total} loss {loss:.4f} {(tokens - self.start_tokens) / dt:.0f} tokens/s "
                     f"{_clock(left)} left")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
