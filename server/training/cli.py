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

import functools
import json
import logging
import os

from edgespec.shared.config_flags import Flag, add_flags, from_args

from .train_config import CaptureConfig, DataConfig, ExtractConfig, FileDataConfig, TrainConfig

# `train data`'s flags: those of the files' data set, those of the stdlib prompts', those of both (where
# --val-fraction is left out, the chosen config's default).
FILE_DATA_FLAGS = {
    "text": Flag(metavar="PATH", help="plain text / code file or folder (walked; repeatable), cut into --chunk-tokens "
                                      "chunks"),
    "text_globs": Flag("--glob", metavar="PATTERN", help="file-name glob of --text files (repeatable; default: "
                                                         "common code and doc extensions)"),
    "chats": Flag("--chat", metavar="FILE"), "answers": Flag(), "chunk_tokens": Flag(), "chunks_per_file": Flag(),
    "max_tokens": Flag(), "val_first": Flag(),
}
PROMPT_DATA_FLAGS = {"n_write": Flag(), "n_explain": Flag(), "n_code": Flag(), "n_complete": Flag(), "n_chat": Flag()}
CAPTURE_FLAGS = {
    "features_out": Flag(metavar="DIR"), "features_contents": Flag(),
    "features_tli": Flag(default="0,1", type=str, action="store",
                         convert=lambda text: tuple(int(x) for x in text.split(",") if x.strip())),
}
BOTH_DATA_FLAGS = {
    "seed": Flag(), "max_new_tokens": Flag(), "batch_size": Flag(),
    "val_fraction": Flag(default=None, help="held-out share (default 0.1 for stdlib prompts, 0.02 for files)"),
}
# `train features`' flags (--tli as the comma-separated list it always was).
EXTRACT_FLAGS = {
    "max_len": Flag(), "tli_depths": Flag("--tli", default="0,1,3", type=str, action="store",
                                          convert=lambda text: tuple(int(x) for x in text.split(",") if x.strip())),
    "batch_tokens": Flag(), "shard_tokens": Flag(), "contents": Flag(),
    "growing": Flag(), "limit": Flag(),
}
# `train fit`'s flags that are the training loop's settings (the others choose the recipe and its features).
FIT_FLAGS = {
    "window": Flag(), "steps": Flag(), "lr": Flag(), "batch_tokens": Flag(), "eval_every": Flag(),
    "eval_sequences": Flag(), "eval_depth": Flag(), "save_every": Flag(),
    "max_wall_s": Flag("--max-minutes", convert=lambda minutes: 60.0 * minutes,
                       help="stop (validate, save, write the drafter) after this much training; 0 = run all steps"),
    "grad_accum": Flag(), "amp": Flag(), "log_every": Flag(), "seed": Flag(), "cache_mb": Flag(),
    "snapshot_tokens": Flag(), "cooldown": Flag(),
}


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train learned drafters (EAGLE, MoA)")
    sub = p.add_subparsers(dest="train_command", metavar="STEP")

    d = sub.add_parser("data", help="training conversations and text: local files, or stdlib prompts + the "
                                    "target's greedy responses")
    d.add_argument("--target", required=True, help="registry name or local HF directory of the target")
    d.add_argument("--out", required=True, help="folder for samples.jsonl (use runs/..., it is git-ignored)")
    add_flags(d, FileDataConfig, FILE_DATA_FLAGS)
    add_flags(d, DataConfig, {**PROMPT_DATA_FLAGS, **BOTH_DATA_FLAGS})
    add_flags(d, CaptureConfig, CAPTURE_FLAGS)
    _common(d)
    d.set_defaults(func=_data)

    f = sub.add_parser("features", help="run the target over the data once; store its features in int8")
    f.add_argument("--target", required=True)
    f.add_argument("--data", required=True, help="folder with samples.jsonl")
    f.add_argument("--out", required=True, help="feature store folder")
    add_flags(f, ExtractConfig, EXTRACT_FLAGS)
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
    t.add_argument("--features", action="append", default=None,
                   help="feature store folder (`edgespec train features`); repeat it to train on several at once")
    t.add_argument("--features-from", choices=("store", "target"), default="store",
                   help="store: read --features; target: run the target beside the drafter on --data as it trains")
    t.add_argument("--data", default=None, help="with --features-from target: the folder with samples.jsonl")
    t.add_argument("--max-len", type=int, default=1024, help="with --features-from target: tokens per sequence")
    t.add_argument("--out", required=True, help="run folder: checkpoints, log.txt, final drafter")
    t.add_argument("--branch-from", default=None, metavar="RUN",
                   help="start --out from RUN's last checkpoint, RUN left as it is (a --cooldown branch)")
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
    handler = logging.FileHandler(os.path.join(args.out, "log.txt" if rank == 0 else f"log.rank{rank}.txt"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)


def _data(args) -> int:
    from .data import build_dataset, build_from_files

    _setup(args)
    if args.text or args.chat:
        if args.features_out:
            raise SystemExit("--features-out keeps the features of the target's answers to generated prompts; with "
                             "--text/--chat run `edgespec train features` on the data folder instead")
        build, cfg = build_from_files, from_args(FileDataConfig, args, {**FILE_DATA_FLAGS, **BOTH_DATA_FLAGS})
    else:
        from .answer_capture import capture_into

        cfg = from_args(DataConfig, args, {**PROMPT_DATA_FLAGS, **BOTH_DATA_FLAGS})
        build = functools.partial(build_dataset, capture=capture_into(from_args(CaptureConfig, args, CAPTURE_FLAGS)))
    print(build(args.target, args.out, cfg, device=args.device, dtype=args.dtype))
    return 0


def _features(args) -> int:
    from .features import extract_features

    _setup(args)
    cfg = from_args(ExtractConfig, args, EXTRACT_FLAGS)
    if args.per_sequence:
        extract_features(args.target, args.data, args.out, max_len=cfg.max_len, tli_depths=cfg.tli_depths,
                         device=args.device, dtype=args.dtype)
        return 0
    from .extraction import extract_sharded

    extract_sharded(args.target, args.data, args.out, cfg, device=args.device, dtype=args.dtype)
    return 0


def _fit(args) -> int:
    from .fit import fit_from_args

    _setup(args)
    return fit_from_args(args, from_args(TrainConfig, args, FIT_FLAGS))


def _ship(args) -> int:
    from .ship import ship

    measured = json.loads(open(args.measured).read()) if args.measured else None
    print(ship(args.run, args.name, args.command, measured))
    return 0


if __name__ == "__main__":  # python -m edgespec.server.training.cli ... (torchrun, accelerate launch)
    import sys

    from edgespec.shared.cli import build_parser, run

    raise SystemExit(run(build_parser([sys.modules[__name__]]), ["train", *sys.argv[1:]]))
