"""The training loop's settings (trainer.py), apart from it so that `edgespec train fit`'s flags come from them
without importing torch (`edgespec --help` stays fast)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000  # optimizer steps in all
    lr: float = 3e-4  # peak learning rate (AdamW)
    warmup: int = 20  # linear warm-up steps, then cosine decay to lr/10
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    grad_clip: float = 0.5  # max global gradient norm
    batch_tokens: int = 2048  # tokens per optimizer step (summed over windows and processes)
    window: int = 512  # longest window cut from one sequence (random start)
    eval_every: int = 100  # steps between validation passes (and at the end)
    eval_depth: int = 6  # draft positions whose acceptance is logged
    eval_sequences: int = 32  # validation sequences per pass (the first ones, for comparable numbers)
    save_every: int = 100  # steps between checkpoints (and at the end)
    seed: int = 0  # data order, windows, noise
    max_wall_s: float = 0.0  # stop (validate, save) once this run has trained this long; 0 = no limit
    grad_accum: int = 1  # micro-batches (separate backward passes) per process and optimizer step
    amp: Literal["auto", "bf16", "off"] = "auto"  # mixed precision: auto = bf16 autocast on CUDA, none on CPU
    log_every: int = 10  # steps between progress lines when not on a terminal

    # Randomness inside windows: "per-window" (seeded by step and window: the same whatever process or
    # micro-batch draws it), "shared" (one stream with the window draws, as runs before data-parallel
    # training had), "auto": per-window under a launcher (WORLD_SIZE set) or with grad_accum > 1.
    window_rng: str = "auto"
