"""The `edgespec` command (also ``python -m edgespec``): the top floor, so it may name every package below
it. Each command's parser lives beside its code; the root parser and the run are shared/cli.py's."""
from __future__ import annotations

import argparse

from edgespec.client import cli as client_cli
from edgespec.netem import cli as netem_cli
from edgespec.netem import demo
from edgespec.netem.bench import cli as bench_cli
from edgespec.server import cli as server_cli
from edgespec.server.training import cli as train_cli
from edgespec.shared import cli
from edgespec.shared.models import cli as models_cli
from edgespec.shared.teardown import limit_teardown

COMMANDS = (models_cli, server_cli, client_cli, demo, netem_cli, bench_cli, train_cli)  # as --help lists them


def build_parser() -> argparse.ArgumentParser:
    return cli.build_parser(COMMANDS)


def main(argv: list[str] | None = None) -> int:
    return cli.run(build_parser(), argv)


def entry() -> int:
    """The process's entry (the `edgespec` script and ``python -m edgespec``): ``main``, then a limit on the
    interpreter's teardown (shared/teardown.py), so a finished command never outlives its work."""
    status = main()
    limit_teardown(status)
    return status
