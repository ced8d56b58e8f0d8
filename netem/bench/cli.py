"""`edgespec bench NAME`: every benchmark of edgespec.

Experiments (experiments.py) start their own server process and relays, append one JSON line per
generation to OUT/EXPERIMENT.jsonl and write OUT/report.md with plots: `speed`, `link`, `disconnect`,
`codec`, `specbench` (Spec-Bench's questions, and its answer files); `report` writes the report again
from what is there. The server and the client run on disjoint cores (`--server-cpus`, `--client-cpus`;
by default the upper and the lower half of the cores), as two machines would.

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
    "specbench": "Spec-Bench's questions through the client and the plain API under a profile, with its answer files",
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
    "multi-turn": ("multi_turn", "turn-2 time to first token with and without the server's prefix cache"),
    "constrained": ("constrained", "tau under a grammar (JSON, tool calls) against free drafting, same prompts"),
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


def _per_category(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--limit takes a number of questions per category (1 or more), got {text!r}")
    return n


def _add_cpu_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server-cpus", default=None, metavar="CPUS",
                   help="the server's cores, as taskset writes them: 1, 2-3, 2,3 (default: the upper half)")
    p.add_argument("--client-cpus", default=None, metavar="CPUS",
                   help="the client's (and the relays') cores (default: the lower half, or the cores the server "
                        "does not have)")
    p.add_argument("--no-pin", action="store_true",
                   help="without --server-cpus/--client-cpus: server and client share every core")


def _add_experiment(benchmarks: argparse._SubParsersAction, name: str, help_text: str) -> None:
    if name == "specbench":
        p = benchmarks.add_parser(name, help=help_text, description=_specbench_doc(),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        p = benchmarks.add_parser(name, help=help_text,
                                  description="Each experiment starts its own server process (and relays), runs the "
                                              "prompt sets, appends one JSON line per generation to "
                                              "OUT/EXPERIMENT.jsonl and writes OUT/report.md with plots.")
    p.add_argument("out", nargs="?", default="runs/bench", help="output folder (default runs/bench)")
    p.add_argument("--model", default=None, help="target (default qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--drafter-model", default=None, help="small model (default qwen2.5-coder-0.5b-instruct)")
    if name == "specbench":
        _add_specbench_options(p)
    else:
        _add_prompt_set_options(p)
    if name not in ("codec", "report"):
        _add_cpu_options(p)
    p.add_argument("--server-threads", type=int, default=None,
                   help="torch threads of the server (default: one per server core when pinned)")
    p.add_argument("--fresh", action="store_true", help="delete this experiment's earlier results first")
    p.add_argument("--no-progress", action="store_true")
    marker = "edgespec-specbench" if name == "specbench" else "edgespec-bench"
    p.add_argument("--readme", default=None,
                   help="also put the report's tables into this Markdown file, between the lines "
                        f"'<!-- {marker}:begin -->' and '<!-- {marker}:end -->'")
    p.add_argument("--readme-marker", default=marker,
                   help=f"the name in the README's marker lines (default {marker})")
    p.set_defaults(func=_run_experiment, experiment=name)


def _specbench_doc() -> str:
    from . import specbench

    return specbench.__doc__


def _add_specbench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafters", type=_csv, default=("ngram", "independent"), help="comma-separated")
    p.add_argument("--profile", dest="profiles", type=_csv, default=("5g",),
                   help="network profile of the relayed links (default 5g; comma-separated for several)")
    p.add_argument("--limit", type=_per_category, default=None,
                   help="the first N questions of each of the 13 categories (default: all 480)")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="per turn (default 1024, as Spec-Bench)")
    p.add_argument("--questions", default="", help="a question file in Spec-Bench's format (default: the shipped one)")


def _add_prompt_set_options(p: argparse.ArgumentParser) -> None:
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
        from edgespec.shared.models.registry import DEFAULT_DRAFTER, DEFAULT_TARGET
        from .experiments import BenchConfig, run

        if args.fresh:
            (out / f"{args.experiment}.jsonl").unlink(missing_ok=True)
        common = dict(model=args.model or DEFAULT_TARGET, drafter_model=args.drafter_model or DEFAULT_DRAFTER,
                      drafters=args.drafters, profiles=args.profiles, max_new_tokens=args.max_new_tokens,
                      server_threads=args.server_threads, progress=not args.no_progress,
                      command=shlex.join(["edgespec", *getattr(args, "argv", sys.argv[1:])]))
        if args.experiment != "codec":
            common.update(server_cpus=args.server_cpus, client_cpus=args.client_cpus, pin=not args.no_pin)
        if args.experiment == "specbench":
            config = BenchConfig(args.experiment, out, questions=args.questions, per_category=args.limit, **common)
        else:
            config = BenchConfig(args.experiment, out, prompt_sets=args.sets, limit=args.limit[0],
                                 set_limits=args.limit[1], cut_after=args.cut_after, cut_mode=args.cut_mode, **common)
        print(f"results: {run(config)}")
    report = write_report(out)
    if args.experiment == "specbench":  # its tables on the terminal too (the other experiments have plots)
        print(report.read_text(encoding="utf-8"))
    print(f"report: {report}")
    if args.readme:
        print(f"README section: {splice_readme(report, Path(args.readme), args.readme_marker)}")
    return 0
