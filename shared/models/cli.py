"""`edgespec models list|prepare|tiny|random`."""
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
    rp = msub.add_parser("random", help="write a random-weight model in a known model's shapes to DIR (timing "
                                        "the server without the weights)")
    rp.add_argument("dir")
    rp.add_argument("--like", default="qwen2.5-coder-1.5b-instruct", help="registry model whose shapes to take")
    rp.add_argument("--shape", default=None, help="another known shape instead (7b: Qwen2.5-7B; small: a "
                                                  "4-layer, 512-wide one for CPU timing)")
    rp.add_argument("--layers", type=int, default=0, help="keep the widths, use this many layers (0 = all)")
    rp.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float16, float32")
    rp.add_argument("--seed", type=int, default=0)
    rp.add_argument("--device", default="cpu", help="where the random numbers are drawn (cuda: a 7B in seconds)")
    rp.set_defaults(func=_random)


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


def _random(args: argparse.Namespace) -> int:
    from edgespec.shared.device import parse_dtype
    from .random_model import save_random_model, shape_of

    try:
        shape = shape_of(args.like, args.shape, args.layers)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    out = save_random_model(args.dir, args.like, shape, parse_dtype(args.dtype), args.seed,
                            device=args.device)
    print(f"random model like {args.like} ({shape.num_layers} layers, hidden {shape.hidden_size}, "
          f"vocab {shape.vocab_size}) written to {out}")
    return 0
