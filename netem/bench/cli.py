"""`edgespec bench NAME`: every benchmark of edgespec.

Experiments (experiments.py) start their own server process and relays, append one JSON line per
generation to OUT/EXPERIMENT.jsonl and write OUT/report.md with plots: `speed`, `link`, `disconnect`,
`codec`; `report` writes the report again from what is there.

Micro-benchmarks print Markdown tables; each is one module of this package with ``add_arguments(parser)``
and ``run(args)``; `--threads` is every one's. They import torch inside ``run``, so that building this
parser (`edgespec --help`) stays fast.
"""
from __future__ import annotations

import argparse
import importlib
from pathlib import Path

# command -> one line of help
EXPERIMENTS: dict[str, str] = {
    "speed": "drafters against the plain API on an ideal link",
    "link": "drafters under network profiles, beside the plain API and the small model alone",
    "disconnect": "HumanEval pass@1 when the link is cut after B new tokens",
    "codec": "the activation codec on a target's real activations, as JSON lines",
    "report": "write OUT/report.md again from OUT's JSON lines",
}

# command -> (module of this package, one line of help)
MICRO_BENCHMARKS: dict[str, tuple[str, str]] = {
    "server": ("server_engines", "the server's engines side by side: verify latency, throughput, device-ms per token"),
    "drafting": ("drafting", "every drafter against plain decoding and transformers' assisted generation"),
    "tree-sweep": ("tree_sweep", "EAGLE-2 tree shapes for the independent drafter, through a server"),
    "independent": ("independent", "the independent drafter alone: pass costs, trees against the target's text"),
    "router": ("router", "a learned drafter with and without its LM-head router"),
    "beagle": ("beagle", "Beagle's training stages and drafting against EAGLE's, per step"),
    "activation-codec": ("activation_codec", "the activation codec on a target's real activations: bytes, error, time"),
    "near-ties": ("near_ties", "where a disconnect run's uncut answers part from the target's own (bf16 near ties)"),
}


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _cuts(text: str) -> tuple[int | None, ...]:
    return tuple(None if x == "never" else int(x) for x in _csv(text))


def _limits(text: str) -> tuple[int, dict[str, int]]:
    """"20" -> (20, {}); "humaneval=40,mtbench=20" -> (largest, {set: n})."""
    try:
        if "=" not in text:
            return int(text), {}
        per = {k.strip(): int(v) for k, v in (x.split("=", 1) for x in _csv(text))}
        return max(per.values()), per
    except ValueError:
        raise argparse.ArgumentTypeError(f"--limit takes N or SET=N,SET=N, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks: experiments under emulated networks (speed, link, disconnect, "
                                     "codec, report) and micro-benchmarks",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchmarks = p.add_subparsers(dest="benchmark", metavar="NAME", required=True)
    for name, help_text in EXPERIMENTS.items():
        _add_experiment(benchmarks, name, help_text)
    for name, (module, help_text) in MICRO_BENCHMARKS.items():
        _add_micro_benchmark(benchmarks, name, module, help_text)


def _add_experiment(benchmarks: argparse._SubParsersAction, name: str, help_text: str) -> None:
    p = benchmarks.add_parser(name, help=help_text,
                              description="Each experiment starts its own server process (and relays), runs the "
                                          "prompt sets, appends one JSON line per generation to "
                                          "OUT/EXPERIMENT.jsonl and writes OUT/report.md with plots.")
    p.add_argument("out", nargs="?", default="runs/bench", help="output folder (default runs/bench)")
    p.add_argument("--model", default=None, help="target (default qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--drafter-model", default=None, help="small model (default qwen2.5-coder-0.5b-instruct)")
    p.add_argument("--drafters", type=_csv, default=("ngram", "independent"),
                   help="comma-separated; NAME@serial, @pipelined, @auto-serial or @auto (the default) picks the "
                        "client's loop, so loops compare in one run")
    p.add_argument("--profiles", type=_csv, default=("5g", "4g"), help="comma-separated network profiles")
    p.add_argument("--sets", type=_csv, default=("humaneval", "mtbench"), help="prompt sets, comma-separated")
    p.add_argument("--limit", type=_limits, default=(20, {}),
                   help="prompts per set: N for every set, or per set, e.g. humaneval=40,mtbench=20")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--cut-after", type=_cuts, default=(1, 10, 25, 50, None), help="e.g. 1,10,25,50,never")
    p.add_argument("--cut-mode", choices=["blackhole", "reset"], default="blackhole")
    p.add_argument("--server-threads", type=int, default=None)
    p.add_argument("--fresh", action="store_true", help="delete this experiment's earlier results first")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--readme", default=None,
                   help="report: also put the report's tables into this Markdown file, between the lines "
                        "'<!-- edgespec-bench:begin -->' and '<!-- edgespec-bench:end -->'")
    p.set_defaults(func=_run_experiment, experiment=name)


def _add_micro_benchmark(benchmarks: argparse._SubParsersAction, name: str, module: str, help_text: str) -> None:
    code = importlib.import_module(f"{__package__}.{module}")
    p = benchmarks.add_parser(name, help=help_text, description=code.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: torch's choice, all cores; 1 suits a CPU other jobs share, where spare "
                        "threads wait on each other)")
    code.add_arguments(p)
    p.set_defaults(func=_run_micro_benchmark, run=code.run, parser=p)  # parser: for the checks argparse cannot make


def _run_micro_benchmark(args: argparse.Namespace) -> int:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return args.run(args)


def _run_experiment(args: argparse.Namespace) -> int:
    import shlex
    import sys

    from .report import splice_readme, write_report

    out = Path(args.out)
    if args.experiment != "report":
        from ...shared.models.registry import DEFAULT_DRAFTER, DEFAULT_TARGET
        from .experiments import BenchConfig, run

        if args.fresh:
            (out / f"{args.experiment}.jsonl").unlink(missing_ok=True)
        config = BenchConfig(args.experiment, out, model=args.model or DEFAULT_TARGET,
                             drafter_model=args.drafter_model or DEFAULT_DRAFTER, drafters=args.drafters,
                             profiles=args.profiles, prompt_sets=args.sets, limit=args.limit[0],
                             set_limits=args.limit[1],
                             max_new_tokens=args.max_new_tokens, cut_after=args.cut_after, cut_mode=args.cut_mode,
                             server_threads=args.server_threads, progress=not args.no_progress,
                             command=shlex.join(["edgespec", *getattr(args, "argv", sys.argv[1:])]))
        print(f"results: {run(config)}")
    report = write_report(out)
    print(f"report: {report}")
    if args.readme:
        print(f"README section: {splice_readme(report, Path(args.readme))}")
    return 0
