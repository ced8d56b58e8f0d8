"""`edgespec demo`: a server and a client on this machine, one prompt end to end.

The server runs the target in this process; the client reaches it through the
network relay shaped by a profile (``--profile none``: over plain loopback).
It lives in netem, beside the experiments, because it puts all three parts
together: the server, the relay and the client.

``--server-cpus``/``--client-cpus`` put the two on disjoint cores, as two
machines would be (``cpus.py``): the server then runs as a child process
(`edgespec server`) on its cores with one torch thread a core, and this
process (the client and the relay) on the client's.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path
from typing import Iterator

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def register(subparsers) -> None:
    from edgespec.client import add_client_options
    from edgespec.shared import defaults

    p = subparsers.add_parser("demo", help="run a server and a client here, one prompt end to end",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="target model (default: the registry's default target)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt")
    p.add_argument("--max-tokens", type=int, default=defaults.MAX_TOKENS, help="most new tokens")
    p.add_argument("--temperature", type=float, default=defaults.TEMPERATURE,
                   help="0 = the target's greedy output; > 0 divides the logits")
    p.add_argument("--seed", type=int, default=defaults.SEED,
                   help="the sampling seed, in [0, 2**64) (unset: a fresh one)")
    p.add_argument("--profile", default=defaults.DEMO_PROFILE,
                   help="network profile for the relay (none: direct, over loopback)")
    p.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    p.add_argument("--server-cpus", default=None, metavar="CPUS",
                   help="run the server on these cores, as taskset writes them: 1, 2-3, 2,3 (default: not pinned)")
    p.add_argument("--client-cpus", default=None, metavar="CPUS",
                   help="run the client and the relay on these cores (default: the cores the server does not have)")
    add_client_options(p)
    p.set_defaults(func=main, drafter=defaults.DRAFTER)


def main(args) -> int:
    from edgespec.shared.models.registry import DEFAULT_TARGET
    from .bench.loopback import relayed
    from .cpus import choose_split, pinned

    if not getattr(args, "verbose", False):  # the server's and relay's logs would interleave with the text
        for name in ("edgespec.server", "edgespec.netem"):
            logging.getLogger(name).setLevel(logging.WARNING)
    args.target = args.target or DEFAULT_TARGET
    split = choose_split(args.server_cpus, args.client_cpus, default_pinned=False)
    print(f"edgespec demo: loading target {args.target} ...", file=sys.stderr, flush=True)
    if split.pinned:
        print(f"edgespec demo: {split.describe()}", file=sys.stderr)
    profile = None if args.profile == "none" else args.profile
    with _serving(args, split) as server_address, pinned(split.client), \
            relayed(server_address, profile) as (address, _):
        if profile:
            print(f"edgespec demo: client -> relay ({profile}) -> server at {server_address}", file=sys.stderr)
        else:
            print(f"edgespec demo: client -> server at {server_address} directly (--profile none)", file=sys.stderr)
        _generate(args, address)
    return 0


@contextlib.contextmanager
def _serving(args, split) -> Iterator[str]:
    """The server's gRPC address while the block runs: in this process, or (pinned) a child process on
    the server's cores."""
    if not split.pinned:
        from edgespec.server import ServerConfig, start_server

        server = start_server(ServerConfig(model=args.target, http_port=None, moa_server_parts=moa_server_parts(args)))
        try:
            yield server.address
        finally:
            server.stop(grace=1.0)
        return
    from .bench.server_process import ServerProcess

    parts = [a for name, path in moa_server_parts(args).items()
             for a in ("--moa-server-part", name if name == path else f"{name}={path}")]
    with ServerProcess(args.target, parts, threads=len(split.server), cpus=split.server) as server:
        yield server.grpc_address


def _generate(args, address: str) -> None:
    """One prompt through the client, printed as it comes."""
    from edgespec.client import (LOOP_GENERATION_FLAGS, TerminalPrinter, client_from_args, generation_config_from_args,
                                 link_config, use_color)

    with client_from_args(args, link_config(args, address)) as client:
        ids = client.encode_chat([{"role": "user", "content": args.prompt}])
        from edgespec.shared import defaults
        from edgespec.shared.session_contract import SamplingSettings

        seed = defaults.fresh_seed() if args.seed is None else args.seed
        config = generation_config_from_args(args, LOOP_GENERATION_FLAGS, max_new_tokens=args.max_tokens,
                                             sampling=SamplingSettings(args.temperature), seed=seed)
        print(f"edgespec demo: drafter {client.drafter.name}; prompt: {args.prompt}\n", file=sys.stderr)
        printer = TerminalPrinter(client.decode, sys.stdout, sys.stderr, use_color(args.color, sys.stdout))
        result = printer.run(client.stream(ids, config))
        print(result.metrics.summary(), file=sys.stderr)


def moa_server_parts(args) -> dict[str, str]:
    """A MoA drafter's Layer Self-Attention runs on the server: the part of the same name (the kind "moa"
    stands for its default shipped checkpoint); nothing for other drafters."""
    from edgespec.client import split_lookup

    drafter = split_lookup(args.drafter)[0]  # moa-tli1+ngram: moa-tli1's part
    if not drafter.startswith("moa"):
        return {}
    from edgespec.client import LEARNED

    moa = args.checkpoint or LEARNED.get(drafter, drafter)
    return {args.moa_server_part or Path(moa).name: moa}
