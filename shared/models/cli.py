"""`edgespec models list|prepare|tiny`."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list and prepare models", description="List and prepare models.")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    lp = msub.add_parser("list", help="registry names, their sources, and whether they are prepared")
    lp.set_defaults(func=_list)
    pp = msub.add_parser("prepare", help="install, join, check and convert a registry model (idempotent)")
    pp.add_argument("names", nargs="+", metavar="NAME")
    pp.add_argument("--no-progress", action="store_true", help="no progress bar")
    pp.set_defaults(func=_prepare)
    tp = msub.add_parser("tiny", help="write a tiny random Qwen2 model and tokenizer to DIR (for tests and demos)")
    tp.add_argument("dir")
    tp.add_argument("--seed", type=int, default=0)
    tp.set_defaults(func=_tiny)


def _list(args: argparse.Namespace) -> int:
    from .prepare import is_prepared
    from .registry import REGISTRY, prepared_dir

    for name, spec in REGISTRY.items():
        state = f"prepared at {prepared_dir(name)}" if is_prepared(name) else "not prepared"
        print(f"{name:32s} {state}\n    {spec.description}")
    print("\nAny local Hugging Face directory or hub id (org/name) also works wherever a model name is asked for.")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from .prepare import prepare

    for name in args.names:
        result = prepare(name, progress=not args.no_progress)
        if result.already:
            print(f"{name}: already prepared at {result.path}; nothing to do")
        else:
            print(f"{name}: prepared at {result.path} in {result.seconds:.0f} s")
    return 0


def _tiny(args: argparse.Namespace) -> int:
    from .tiny import TinyConfig, save_tiny_model

    out = save_tiny_model(args.dir, TinyConfig(seed=args.seed))
    print(f"tiny model written to {out}")
    return 0
