"""`edgespec train`: build the data set, extract the target's features, train a drafter.

    edgespec train data     --target NAME --out runs/data/NAME        (target's own responses; resumable)
    edgespec train features --target NAME --data DIR --out DIR        (hidden states + all-layer KV, int8; resumable)
    edgespec train fit      --kind RECIPE --target NAME --features DIR --out DIR [--opt K=V]  (resumable)
    edgespec train ship     --run DIR --name NAME                     (into the shipped checkpoints)
"""
from __future__ import annotations

import os


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train learned drafters (EAGLE, MoA)")
    sub = p.add_subparsers(dest="train_command", metavar="STEP")

    d = sub.add_parser("data", help="prompts from local code/docs + the target's greedy responses")
    d.add_argument("--target", required=True, help="registry name or local HF directory of the target")
    d.add_argument("--out", required=True, help="folder for samples.jsonl (use runs/..., it is git-ignored)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--n-write", type=int, default=200)
    d.add_argument("--n-explain", type=int, default=100)
    d.add_argument("--n-code", type=int, default=60)
    d.add_argument("--max-new-tokens", type=int, default=192)
    d.add_argument("--batch-size", type=int, default=8)
    d.add_argument("--val-fraction", type=float, default=0.1)
    _common(d)
    d.set_defaults(func=_data)

    f = sub.add_parser("features", help="run the target over the data once; store its features in int8")
    f.add_argument("--target", required=True)
    f.add_argument("--data", required=True, help="folder with samples.jsonl")
    f.add_argument("--out", required=True, help="feature store folder")
    f.add_argument("--max-len", type=int, default=1024, help="tokens per sequence at most")
    f.add_argument("--tli", default="0,1,3", help="TLI depths whose target activations to store")
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
    t.add_argument("--features", required=True)
    t.add_argument("--out", required=True, help="run folder: checkpoints, log.txt, final drafter")
    t.add_argument("--tli", type=int, default=0, help="MoA: target layers run on the client (0, 1 or 3)")
    t.add_argument("--width", type=int, default=0, help="drafter's internal width (0: the kind's default)")
    t.add_argument("--heads", type=int, default=0)
    t.add_argument("--vocab", type=int, default=0, help="reduced draft vocabulary size (0: full)")
    t.add_argument("--unroll", type=int, default=1, help="EAGLE: drafting steps trained per start (training-time test)")
    t.add_argument("--window", type=int, default=512, help="longest window of one sequence in a batch")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--batch-tokens", type=int, default=2048)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--eval-sequences", type=int, default=32, help="validation sequences per pass")
    t.add_argument("--eval-depth", type=int, default=6, help="draft positions whose acceptance is logged")
    t.add_argument("--save-every", type=int, default=100)
    t.add_argument("--max-minutes", type=float, default=0.0,
                   help="stop (validate, save, write the drafter) after this much training; 0 = run all steps")
    t.add_argument("--seed", type=int, default=0)
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
    p.add_argument("--dtype", default=None, help="target dtype (default bf16)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")


def _setup(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    _log_to(os.path.join(args.out, "log.txt"))


def _log_to(path: str) -> None:
    import logging

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)


def _data(args) -> int:
    from .data import DataConfig, build_dataset

    _setup(args)
    cfg = DataConfig(seed=args.seed, n_write=args.n_write, n_explain=args.n_explain, n_code=args.n_code,
                     max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, val_fraction=args.val_fraction)
    path = build_dataset(args.target, args.out, cfg, device=args.device, dtype=args.dtype)
    print(path)
    return 0


def _features(args) -> int:
    from .features import extract_features

    _setup(args)
    tli = tuple(int(x) for x in args.tli.split(",") if x.strip())
    extract_features(args.target, args.data, args.out, max_len=args.max_len, tli_depths=tli,
                     device=args.device, dtype=args.dtype)
    return 0


def _fit(args) -> int:
    from .fit import fit_from_args

    _setup(args)
    return fit_from_args(args)


def _ship(args) -> int:
    import json

    from .ship import ship

    measured = json.loads(open(args.measured).read()) if args.measured else None
    print(ship(args.run, args.name, args.command, measured))
    return 0


if __name__ == "__main__":  # python -m edgespec.server.training.cli ...
    from ...shared.cli import main

    raise SystemExit(main(["train", *__import__("sys").argv[1:]]))
