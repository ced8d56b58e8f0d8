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
import operator
import shlex
import sys
from pathlib import Path

from edgespec.shared.config_flags import Flag, add_flags, from_args
from . import experiments, specbench
from .experiments import BenchConfig
from .records import record_files
from .report import splice_readme, write_report
from .results_index import has_experiment, write_index

# command -> one line of help
EXPERIMENTS: dict[str, str] = {
    "speed": "drafters against the plain API on an ideal link",
    "link": "drafters under network profiles, beside the plain API and the small model alone",
    "disconnect": "HumanEval pass@1 when the link is cut after B new tokens",
    "codec": "the activation codec on a target's real activations, as JSON lines",
    "specbench": "Spec-Bench's questions through the client and the plain API under a profile, with its answer files",
    "report": "write OUT/report.md again from OUT's JSON lines; given a results tree, its index (OUT/README.md)",
}

# command -> (module of this package, one line of help)
MICRO_BENCHMARKS: dict[str, tuple[str, str]] = {
    "server": ("server_engines", "the server's engines side by side: verify latency, throughput, device-ms per token"),
    "capacity": ("capacity", "N sessions of oracle-drafted trees against N plain-API streams on one server, each behind its own link"),
    "drafting": ("drafting", "every drafter against plain decoding and transformers' assisted generation"),
    "tree-sweep": ("tree_sweep", "EAGLE-2 tree shapes for the independent drafter, through a server"),
    "independent": ("independent", "the independent drafter alone: pass costs, trees against the target's text"),
    "gpu-projection": ("gpu_projection", "computed: a drafting run's trees against a GPU server's verification times and a profile's link"),
    "drafter-curve": ("drafter_curve", "learned drafters' chain acceptance on the target's own answers, per training snapshot"),
    "router": ("router", "a learned drafter with and without its LM-head router"),
    "beagle": ("beagle", "Beagle's training stages and drafting against EAGLE's, per step"),
    "fit-speed": ("fit_speed", "training tokens/s of each recipe on a feature store, the frozen weights cast once or per call"),
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


# An experiment's flags are BenchConfig's fields (shared/config_flags.py); experiment_flags says which.
MODEL_FLAGS = {
    "model": Flag(default=None, help="target (default qwen2.5-coder-1.5b-instruct)"),
    "drafter_model": Flag(default=None, help="small model (default qwen2.5-coder-0.5b-instruct)"),
}
PROMPT_SET_FLAGS = {
    "drafters": Flag(type=_csv, action="store",
                     help="comma-separated; NAME@serial, @pipelined, @auto-serial, @auto-1 or @auto (the default) "
                          "picks the client's loop, NAME:BxDxM[@min_prob] the tree shape and NAME+int8 (or +int4-mlp, "
                          "+float) the independent drafter's weights, NAME+ngram prompt lookup merged into its trees, so "
                          "loops, shapes and weights compare in one run"),
    "profiles": Flag(type=_csv, action="store", help="comma-separated network profiles"),
    "prompt_sets": Flag("--sets", type=_csv, action="store", help="prompt sets, comma-separated"),
    # --limit N,SET=N is limit and set_limits (which _run_experiment gives from_args itself)
    "limit": Flag(type=_limits, default=(BenchConfig.limit, {}), convert=operator.itemgetter(0),
                  help="prompts per set: N for every set, or per set, e.g. humaneval=40,mtbench=20"),
    "max_new_tokens": Flag(),
    "cut_after": Flag(type=_cuts, action="store", help="e.g. 1,10,25,50,never"),
    "cut_mode": Flag(),
}
SPECBENCH_FLAGS = {
    "drafters": Flag(type=_csv, action="store", help="comma-separated"),
    "profiles": Flag("--profile", dest="profiles", type=_csv, action="store", default=("5g",),
                     help="network profile of the relayed links (default 5g; comma-separated for several)"),
    "per_category": Flag("--limit", type=_per_category,
                         help="the first N questions of each of the 13 categories (default: all 480)"),
    "max_new_tokens": Flag(default=1024, help="per turn (default 1024, as Spec-Bench)"),
    "questions": Flag(help="a question file in Spec-Bench's format (default: the shipped one)"),
    "categories": Flag(type=_csv, action="store",
                       help="comma-separated categories to run, e.g. writing,qa, or mt_bench for MT-Bench's eight "
                            "(default: all 13)"),
}
CPU_FLAGS = {
    "server_cpus": Flag(metavar="CPUS", help="the server's cores, as taskset writes them: 1, 2-3, 2,3 (default: the "
                                             "upper half)"),
    "client_cpus": Flag(metavar="CPUS", help="the client's (and the relays') cores (default: the lower half, or the "
                                             "cores the server does not have)"),
    "pin": Flag("--no-pin", default=False, convert=operator.not_,
                help="without --server-cpus/--client-cpus: server and client share every core"),
}
REMOTE_FLAGS = {
    "server": Flag(metavar="HOST:PORT",
                   help="measure a server started elsewhere (its gRPC port) over the network as it is, shaped by "
                        "`edgespec netem apply` or not (every line records what tc shows on the route to it); "
                        "--profiles does not apply (default: start a server here, behind emulating relays)"),
    "server_http": Flag(metavar="HOST:PORT", help="with --server: its HTTP side, for the plain API baseline "
                                                   "(default: the same host, port 8080)"),
}
RUN_FLAGS = {
    "server_threads": Flag(help="torch threads of the server (default: one per server core when pinned)"),
    "server_dtype": Flag(metavar="DTYPE", choices=("bfloat16", "float16", "float32"),
                         help="the server's dtype (default: its own, bf16 where the CPU computes it natively)"),
    "server_args": Flag("--server-arg", metavar="FLAG",
                        help="one more `edgespec server` flag for the server the run starts, as --server-arg=FLAG "
                             "(--server-arg=--no-packed-weights)"),
    "progress": Flag("--no-progress", default=False, convert=operator.not_, help="no progress bar"),
}


def experiment_flags(name: str) -> dict[str, Flag]:
    """The BenchConfig fields experiment `name` takes on its command line."""
    options = SPECBENCH_FLAGS if name == "specbench" else PROMPT_SET_FLAGS
    remote = REMOTE_FLAGS if name in experiments.REMOTE_EXPERIMENTS else {}
    return {**MODEL_FLAGS, **options, **({} if name in ("codec", "report") else CPU_FLAGS), **remote, **RUN_FLAGS}


def _add_experiment(benchmarks: argparse._SubParsersAction, name: str, help_text: str) -> None:
    if name == "specbench":
        p = benchmarks.add_parser(name, help=help_text, description=specbench.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        p = benchmarks.add_parser(name, help=help_text,
                                  description="Each experiment starts its own server process (and relays), runs the "
                                              "prompt sets, appends one JSON line per generation to "
                                              "OUT/EXPERIMENT.jsonl and writes OUT/report.md with plots.")
    p.add_argument("out", nargs="?", default="runs/bench", help="output folder (default runs/bench)")
    add_flags(p, BenchConfig, experiment_flags(name))
    p.add_argument("--fresh", action="store_true", help="delete this experiment's earlier results first")
    p.add_argument("--no-plots", dest="plots", action="store_false",
                   help="write report.md without drawing the plots (an archived experiment keeps none)")
    marker = "edgespec-specbench" if name == "specbench" else "edgespec-bench"
    p.add_argument("--readme", default=None,
                   help="also put the report's tables into this Markdown file, between the lines "
                        f"'<!-- {marker}:begin -->' and '<!-- {marker}:end -->'")
    p.add_argument("--readme-marker", default=marker,
                   help=f"the name in the README's marker lines (default {marker})")
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
    out = Path(args.out)
    if args.experiment == "report" and out.is_dir() and not has_experiment(out) and not args.readme:
        # A results tree (a folder of experiment folders): its index.
        print(f"index: {write_index(out)}")
        return 0
    if args.experiment != "report":
        if args.fresh:
            for path in record_files(out, args.experiment):
                path.unlink()
        given = {} if args.experiment == "specbench" else {"set_limits": args.limit[1]}
        config = from_args(BenchConfig, args, experiment_flags(args.experiment), experiment=args.experiment, out=out,
                           command=shlex.join(["edgespec", *getattr(args, "argv", sys.argv[1:])]), **given)
        print(f"results: {experiments.run(config)}")
    report = write_report(out, plots=args.plots)
    if args.experiment == "specbench":  # its tables on the terminal too (the other experiments have plots)
        print(report.read_text(encoding="utf-8"))
    print(f"report: {report}")
    if args.readme:
        print(f"README section: {splice_readme(report, Path(args.readme), args.readme_marker)}")
    return 0
