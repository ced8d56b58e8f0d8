"""The `edgespec` command. Each subcommand lives in its own module, which
defines ``register(subparsers)``; a subcommand whose module does not exist yet
is simply absent. Those modules import heavy things (torch, transformers) inside
their handlers, so `edgespec --help` stays fast."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from . import __version__
from .config import LayeredParser

SUBCOMMANDS: dict[str, str] = {
    "models": "edgespec.shared.models.cli",
    "server": "edgespec.server.cli",
    "client": "edgespec.client.cli",
    "demo": "edgespec.netem.demo",
    "netem": "edgespec.netem.cli",
    "bench": "edgespec.netem.bench.cli",
    "train": "edgespec.server.training.cli",
}


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def build_parser() -> argparse.ArgumentParser:
    # Subparsers are built with the root's class: every command gets defaults in --help, and the
    # commands that call config.enable_layers read EDGESPEC_* variables and --config files.
    parser = LayeredParser(
        prog="edgespec", description="Client-server speculative decoding for edge devices.")
    parser.add_argument("--version", action="version", version=f"edgespec {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (same as --log-level debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        if _available(module):
            importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed: runs record the command that made them
    from .logging_setup import configure_logging

    # One setup for every command; server and client add --log-format and --log-level.
    configure_logging(getattr(args, "log_format", "text"),
                      "debug" if args.verbose else getattr(args, "log_level", "info"))
    import logging

    for warning in getattr(args, "config_warnings", ()):  # unknown EDGESPEC_* variables (config.unknown_env)
        logging.getLogger("edgespec.config").warning(warning)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .errors import EdgespecError

    try:
        return int(args.func(args) or 0)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
