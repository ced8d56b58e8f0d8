"""The `edgespec` command: the top floor, so it may name every package below it. Each subcommand's
parser lives beside its code (``register(subparsers)``); the root parser and the run are shared/cli.py's.
Also ``python -m edgespec`` and ``python -m edgespec.cli``."""
from __future__ import annotations

import argparse
import sys

from edgespec.client import cli as client_cli
from edgespec.netem import cli as netem_cli
from edgespec.netem import demo
from edgespec.netem.bench import cli as bench_cli
from edgespec.server import cli as server_cli
from edgespec.server.training import cli as train_cli
from edgespec.shared.cli import root_parser, run
from edgespec.shared.models import cli as models_cli

# In the order `edgespec --help` lists them.
SUBCOMMANDS = (models_cli, server_cli, client_cli, demo, netem_cli, bench_cli, train_cli)


def build_parser() -> argparse.ArgumentParser:
    parser, sub = root_parser()
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
