"""Training tokens/s of each recipe on a feature store: what `edgespec train fit` affords on this machine.

    edgespec bench fit-speed --tiny
    edgespec bench fit-speed --target qwen2.5-coder-1.5b-instruct --features STORE [--features STORE2] \\
        --kinds eagle,moa --tli 1 --width 768 --heads 12 --vocab 32768 --steps 3 --threads 1

Trains nothing to completion: after ``--warmup`` untimed steps it times ``--steps`` optimizer steps of each
recipe on the same windows (the trainer's own batches, seed 0), as a run's segment takes them. Under bf16
autocast (``--amp bf16``, the long run's setting) each recipe runs twice: with the target's frozen weights cast
once and kept (``TargetParts.cast_once``, what training does) and with autocast casting them on every call,
the baseline measured in the same run. A ``--features`` store too large for memory is read as training reads it
(an LRU of ``--cache-mb``).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from .beagle import tiny_store


def time_fit(recipe, store, run_dir: Path, steps: int, warmup: int, batch_tokens: int, amp: str,
             cache_mb: int) -> tuple[float, int]:
    """(seconds, tokens) of ``steps`` optimizer steps after ``warmup`` untimed ones."""
    from edgespec.server import TrainConfig, Trainer

    cfg = TrainConfig(steps=steps + warmup, lr=1e-4, warmup=1, batch_tokens=batch_tokens, seed=0, amp=amp,
                      cache_mb=cache_mb, eval_every=10**9, save_every=10**9)
    trainer = Trainer(recipe, store, run_dir, cfg)
    for _ in range(warmup):
        trainer.train_step()
    before, t0 = trainer.tokens_seen, time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    return time.perf_counter() - t0, trainer.tokens_seen - before


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tiny", action="store_true", help="build a tiny target and store in a temporary folder")
    p.add_argument("--target", help="registry name or folder of the target")
    p.add_argument("--features", action="append", default=[], help="feature store folder (repeatable)")
    p.add_argument("--kinds", default="eagle,moa", help="recipes, comma-separated (default eagle,moa)")
    p.add_argument("--tli", type=int, default=1, help="MoA's TLI depth (default 1)")
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32768, help="the cross-entropy's vocabulary (0 = full)")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps per recipe and mode")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--amp", choices=("bf16", "off"), default="bf16", help="bf16 autocast (default) or float32")
    p.add_argument("--cache-mb", type=int, default=1024)
    p.set_defaults(threads=1)


def run(args: argparse.Namespace) -> int:
    from edgespec.server import build_recipe, open_stores

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds:
        args.parser.error("--kinds names no recipe")
    if args.steps < 1 or args.warmup < 0:
        args.parser.error("--steps must be at least 1 and --warmup at least 0")
    modes = ("cast once", "cast per call") if args.amp == "bf16" else ("float32",)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.tiny:
            target, store = tiny_store(tmp / "tiny", tli_depths=(0, 1))
            width, heads, vocab = 32, 4, 0
        elif args.target and args.features:
            target, store = args.target, open_stores(args.features)
            width, heads, vocab = args.width, args.heads, args.vocab
        else:
            args.parser.error("give --tiny, or --target and --features")
        for kind in kinds:
            recipe = build_recipe(kind, target, store, tli=args.tli, width=width, heads=heads, vocab=vocab,
                                  run_dir=tmp / f"{kind}-vocab")
            for mode in modes:
                recipe.parts.cast_once = mode != "cast per call"
                seconds, tokens = time_fit(recipe, store, tmp / f"{kind}-{mode.replace(' ', '-')}", args.steps,
                                           args.warmup, args.batch_tokens, args.amp, args.cache_mb)
                rows.append((kind, mode, tokens, seconds))
    print(f"threads={args.threads} amp={args.amp} width={width} heads={heads} vocab={vocab or 'full'} "
          f"batch_tokens={args.batch_tokens} steps={args.steps} (after {args.warmup} untimed)")
    print("| recipe | frozen weights | tokens | s | tokens/s | vs per call |")
    print("|---|---|---|---|---|---|")
    for kind, mode, tokens, seconds in rows:
        base = next((t / s for k, m, t, s in rows if k == kind and m == "cast per call"), None)
        rate = tokens / seconds
        ratio = "-" if base is None else f"{rate / base:.2f}x"
        print(f"| {kind} | {mode} | {tokens} | {seconds:.1f} | {rate:.1f} | {ratio} |")
    return 0
