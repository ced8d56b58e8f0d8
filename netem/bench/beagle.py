"""Per-step cost of Beagle's two training stages against EAGLE, and drafting cost, on one store.

    edgespec bench beagle --tiny
    edgespec bench beagle --target qwen2.5-coder-1.5b-instruct \\
        --features runs/features/qwen1.5b --width 384 --heads 6 --vocab 8192 --batch-tokens 1024

Trains nothing to completion: it times ``--steps`` optimizer steps of each recipe (after two
warm-up steps) on the same windows: EAGLE plain and with ``unroll`` = k (its multi-step
training, the baseline of Beagle's late stage), Beagle's early and late stages. Then the
runtime's drafting of one EAGLE-2-like tree (root + ``--depth`` levels of ``--branch`` nodes)
over a committed prefix. Ratios are against plain EAGLE measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

RECIPES = (("eagle", {}), ("eagle unroll=k", {}), ("beagle early", {"stage": "early"}),
           ("beagle late", {"stage": "late"}))


def tiny_store(where: Path, tli_depths: tuple[int, ...] = (0,)):
    """A 4-layer tiny target and a feature store of its own greedy responses (as the tests make); ``tli_depths``:
    the TLI activations kept (MoA TLI N needs N)."""
    from edgespec.server import FeatureStore, extract_features, generate_batch
    from edgespec.shared.models import load_model
    from edgespec.shared.models.tiny import TinyConfig, save_tiny_model

    target_dir = save_tiny_model(where / "target", TinyConfig(num_layers=4, seed=0))
    target = load_model(str(target_dir), device="cpu", dtype="float32")
    prompts = [f"Write function number {i} that adds two numbers." for i in range(8)]
    responses = generate_batch(target.model, target.tokenizer, prompts, max_new_tokens=60)
    data = where / "data"
    data.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"w{i}", "kind": "write", "split": "val" if i == 7 else "train", "prompt": p, "response": r}
            for i, (p, r) in enumerate(zip(prompts, responses))]
    (data / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    extract_features(str(target_dir), data, where / "features", max_len=200, tli_depths=tli_depths, device="cpu",
                     dtype="float32")
    return str(target_dir), FeatureStore(where / "features")


def time_training(recipe, store, run_dir: Path, steps: int, batch_tokens: int, window: int) -> float:
    """Median seconds per optimizer step."""
    from edgespec.server import TrainConfig, Trainer

    trainer = Trainer(recipe, store, run_dir, TrainConfig(steps=steps + 2, lr=1e-3, warmup=1,
                                                          batch_tokens=batch_tokens, window=window, seed=0))
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        trainer.train_step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_drafting(runtime, seq, prefix: int, depth: int, branch: int, repeats: int = 20) -> float:
    """Median seconds to draft one tree: root distribution + ``depth`` levels of ``branch`` nodes."""
    import torch

    from edgespec.shared.tree import ROOT

    times = []
    with torch.inference_mode():
        runtime.reset()
        runtime.commit(seq.tokens[:prefix + 1].tolist(), seq.hidden[:prefix])
        for _ in range(repeats):
            t0 = time.perf_counter()
            lp = runtime.root_logprobs()
            tokens = runtime.parts.to_target_ids(lp.topk(branch).indices).tolist()
            level = runtime.expand(tokens, [ROOT] * branch)
            first = 0
            for _ in range(depth - 1):
                best = runtime.parts.to_target_ids(level[0].topk(branch).indices).tolist()
                level = runtime.expand(best, [first] * branch)
                first += branch
            runtime.clear_draft()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tiny", action="store_true", help="build a tiny target and store in a temporary folder")
    p.add_argument("--target", help="registry name or folder of the target")
    p.add_argument("--features", help="feature store folder")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=0, help="reduced draft vocabulary (0 = full)")
    p.add_argument("--block", type=int, default=4, help="Beagle's k")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps per recipe")
    p.add_argument("--batch-tokens", type=int, default=256)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--depth", type=int, default=5, help="draft tree levels")
    p.add_argument("--branch", type=int, default=4, help="nodes per draft tree level")
    p.set_defaults(threads=1)


def run(args: argparse.Namespace) -> int:
    import torch

    from edgespec.client import open_runtime
    from edgespec.server import FeatureStore, build_recipe

    p = args.parser
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.tiny:
            target, store = tiny_store(tmp / "tiny")
        elif args.target and args.features:
            target, store = args.target, FeatureStore(args.features)
        else:
            p.error("give --tiny, or --target and --features")
        seq = FeatureStore.load(store.split("val")[0] if store.split("val") else store.split("train")[0], ("hidden",))
        rows = []
        for name, opts in RECIPES:
            kind = name.split()[0]
            if kind == "beagle":
                opts = {**opts, "block": str(args.block)}
            elif "unroll" in name:  # EAGLE's training-time test over k steps: the multi-step baseline
                opts = {"unroll": str(args.block)}
            torch.manual_seed(0)
            recipe = build_recipe(kind, target, store, width=args.width, heads=args.heads, vocab=args.vocab,
                                  special_ids=(), options=opts)
            step_s = time_training(recipe, store, tmp / name.replace(" ", "-"), args.steps, args.batch_tokens,
                                   args.window)
            files = recipe.save_drafter(tmp / name.replace(" ", "-"))
            runtime = open_runtime(files[0], target)
            draft_s = time_drafting(runtime, seq, min(seq.tokens.shape[0] - 2, 120), args.depth, args.branch)
            rows.append((name, step_s, draft_s))
    base_step, base_draft = rows[0][1], rows[0][2]
    print(f"threads={args.threads} width={args.width} heads={args.heads} vocab={args.vocab or 'full'} "
          f"k={args.block} batch_tokens={args.batch_tokens} tree={args.depth}x{args.branch}")
    print(f"{'recipe':<16}{'ms/step':>10}{'vs eagle':>10}{'ms/tree':>10}{'vs eagle':>10}")
    for name, step_s, draft_s in rows:
        print(f"{name:<16}{step_s * 1e3:>10.1f}{step_s / base_step:>10.2f}{draft_s * 1e3:>10.2f}"
              f"{draft_s / base_draft:>10.2f}")
    return 0

