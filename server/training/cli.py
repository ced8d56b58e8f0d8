"""`edgespec train`: build the data set, extract the target's features, train a drafter.

    edgespec train data     --target NAME --out DIR [--text PATH ...] [--chat FILE ...] [--answers given|target]
                            (local ShareGPT / messages / text files; no --text/--chat: stdlib prompts and the
                            target's own responses; resumable)
    edgespec train features --target NAME --data DIR --out DIR        (hidden states + all-layer KV, int8 shards,
                            many sequences per forward; resumable)
    edgespec train fit      --kind RECIPE --target NAME --features DIR --out DIR [--opt K=V]  (resumable;
                            under `torchrun --nproc-per-node N` data-parallel on N processes)
    edgespec train ship     --run DIR --name NAME                     (into the shipped checkpoints)
"""
from __future__ import annotations

import os

from edgespec.shared.config_flags import Flag, add_flags

from .train_config import TrainConfig

# `train fit`'s flags that are the training loop's settings (the others choose the recipe and its features).
FIT_FLAGS = {
    "window": Flag(), "steps": Flag(), "lr": Flag(), "batch_tokens": Flag(), "eval_every": Flag(),
    "eval_sequences": Flag(), "eval_depth": Flag(), "save_every": Flag(),
    "max_wall_s": Flag("--max-minutes", convert=lambda minutes: 60.0 * minutes,
                       help="stop (validate, save, write the drafter) after this much training; 0 = run all steps"),
    "grad_accum": Flag(), "amp": Flag(), "log_every": Flag(), "seed": Flag(),
}


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train learned drafters (EAGLE, MoA)")
    sub = p.add_subparsers(dest="train_command", metavar="STEP")

    d = sub.add_parser("data", help="training conversations and text: local files, or stdlib prompts + the "
                                    "target's greedy responses")
    d.add_argument("--target", required=True, help="registry name or local HF directory of the target")
    d.add_argument("--out", required=True, help="folder for samples.jsonl (use runs/..., it is git-ignored)")
    d.add_argument("--text", action="append", default=[], metavar="PATH",
                   help="plain text / code file or folder (walked; repeatable), cut into --chunk-tokens chunks")
    d.add_argument("--glob", action="append", default=[], metavar="PATTERN",
                   help="file-name glob of --text files (repeatable; default: common code and doc extensions)")
    d.add_argument("--chat", action="append", default=[], metavar="FILE",
                   help="ShareGPT (conversations: [{from, value}]) or OpenAI-style messages JSON/JSONL (repeatable)")
    d.add_argument("--answers", choices=("given", "target"), default="given",
                   help="chat files: keep their assistant turns, or have the target rewrite them (self-distillation)")
    d.add_argument("--chunk-tokens", type=int, default=512, help="target tokens per text chunk")
    d.add_argument("--chunks-per-file", type=int, default=4, help="text chunks taken from one file at most")
    d.add_argument("--max-tokens", type=int, default=0, help="text: stop at about this many tokens (0: all)")
    d.add_argument("--val-first", type=int, default=8,
                   help="text: this many held-out chunks go first, so a store cut short can be validated on")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--n-write", type=int, default=200)
    d.add_argument("--n-explain", type=int, default=100)
    d.add_argument("--n-code", type=int, default=60)
    d.add_argument("--max-new-tokens", type=int, default=192, help="length cap of a generated answer")
    d.add_argument("--batch-size", type=int, default=8)
    d.add_argument("--val-fraction", type=float, default=None,
                   help="held-out share (default 0.1 for stdlib prompts, 0.02 for files)")
    _common(d)
    d.set_defaults(func=_data)

    f = sub.add_parser("features", help="run the target over the data once; store its features in int8")
    f.add_argument("--target", required=True)
    f.add_argument("--data", required=True, help="folder with samples.jsonl")
    f.add_argument("--out", required=True, help="feature store folder")
    f.add_argument("--max-len", type=int, default=1024, help="tokens per sequence at most")
    f.add_argument("--tli", default="0,1,3", help="TLI depths whose target activations to store")
    f.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per target forward")
    f.add_argument("--shard-tokens", type=int, default=16384,
                   help="tokens per shard file (a killed run loses at most the shard it was on)")
    f.add_argument("--per-sequence", action="store_true",
                   help="the older layout: one file per sequence, one sequence per forward")
    _common(f)
    f.set_defaults(func=_features)

    t = sub.add_parser("fit", help="train an EAGLE or MoA drafter on a feature store")
    t.add_argument("--kind", required=True,
                   help="training recipe: eagle, moa, or one registered by a recipe module (e.g. eagle+hass); "
                        "an unknown name lists the known ones")
    t.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="set a field of the recipe's config (repeatable), e.g. --opt unroll=3 --opt topk=10")
    t.add_argument("--init", default=None,
                   help="a run folder or drafter file whose weights start this run (second training stages)")
    t.add_argument("--target", required=True, help="the target whose embedding / norm / LM head the drafter uses")
    t.add_argument("--features", default=None, help="feature store folder (`edgespec train features`)")
    t.add_argument("--features-from", choices=("store", "target"), default="store",
                   help="store: read --features; target: run the target beside the drafter on --data as it trains")
    t.add_argument("--data", default=None, help="with --features-from target: the folder with samples.jsonl")
    t.add_argument("--max-len", type=int, default=1024, help="with --features-from target: tokens per sequence")
    t.add_argument("--out", required=True, help="run folder: checkpoints, log.txt, final drafter")
    t.add_argument("--tli", type=int, default=0, help="MoA: target layers run on the client (0, 1 or 3)")
    t.add_argument("--width", type=int, default=0, help="drafter's internal width (0: the kind's default)")
    t.add_argument("--heads", type=int, default=0)
    t.add_argument("--vocab", type=int, default=0, help="reduced draft vocabulary size (0: full)")
    t.add_argument("--unroll", type=int, default=1, help="EAGLE: drafting steps trained per start (training-time test)")
    add_flags(t, TrainConfig, FIT_FLAGS)
    _common(t)
    t.set_defaults(func=_fit)
    s = sub.add_parser("ship", help="copy a run's drafter into the shipped checkpoints, with its card")
    s.add_argument("--run", required=True, help="the fit run folder")
    s.add_argument("--name", required=True, help="shipped name, e.g. moa-tli0 (loads with --drafter NAME)")
    s.add_argument("--command", default="", help="the command that trained it (goes on the card)")
    s.add_argument("--measured", default=None, help="JSON file of benchmark figures to put on the card")
    s.set_defaults(func=_ship)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _common(p) -> None:
    p.add_argument("--device", default=None, help="cpu, cuda:0, ... (default: CUDA if present)")
    p.add_argument("--dtype", default=None,
                   help="target dtype (default: bf16 on GPUs and CPUs with native bf16, else float32)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")


def _setup(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))  # under torchrun each process keeps its own log
    _log_to(os.path.join(args.out, "log.txt" if rank == 0 else f"log.rank{rank}.txt"))


def _log_to(path: str) -> None:
    import logging

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)


def _data(args) -> int:
    from .data import DataConfig, FileDataConfig, build_dataset, build_from_files

    _setup(args)
    if args.text or args.chat:
        cfg = FileDataConfig(text=tuple(args.text), chats=tuple(args.chat), text_globs=tuple(args.glob),
                             answers=args.answers, chunk_tokens=args.chunk_tokens, chunks_per_file=args.chunks_per_file,
                             max_tokens=args.max_tokens, val_first=args.val_first, max_new_tokens=args.max_new_tokens,
                             batch_size=args.batch_size, seed=args.seed,
                             val_fraction=0.02 if args.val_fraction is None else args.val_fraction)
        print(build_from_files(args.target, args.out, cfg, device=args.device, dtype=args.dtype))
        return 0
    cfg = DataConfig(seed=args.seed, n_write=args.n_write, n_explain=args.n_explain, n_code=args.n_code,
                     max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                     val_fraction=0.1 if args.val_fraction is None else args.val_fraction)
    path = build_dataset(args.target, args.out, cfg, device=args.device, dtype=args.dtype)
    print(path)
    return 0


def _features(args) -> int:
    from .features import extract_features

    _setup(args)
    tli = tuple(int(x) for x in args.tli.split(",") if x.strip())
    if args.per_sequence:
        extract_features(args.target, args.data, args.out, max_len=args.max_len, tli_depths=tli,
                         device=args.device, dtype=args.dtype)
        return 0
    from .extraction import ExtractConfig, extract_sharded

    cfg = ExtractConfig(max_len=args.max_len, tli_depths=tli, batch_tokens=args.batch_tokens,
                        shard_tokens=args.shard_tokens)
    extract_sharded(args.target, args.data, args.out, cfg, device=args.device, dtype=args.dtype)
    return 0


def _fit(args) -> int:
    from edgespec.shared.config_flags import from_args

    from .fit import fit_from_args

    _setup(args)
    return fit_from_args(args, from_args(TrainConfig, args, FIT_FLAGS))


def _ship(args) -> int:
    import json

    from .ship import ship

    measured = json.loads(open(args.measured).read()) if args.measured else None
    print(ship(args.run, args.name, args.command, measured))
    return 0


if __name__ == "__main__":  # python -m edgespec.server.training.cli ... (torchrun, accelerate launch)
    import sys

    from edgespec.shared.cli import build_parser, run

    raise SystemExit(run(build_parser([sys.modules[__name__]]), ["train", *sys.argv[1:]]))
