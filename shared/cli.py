"""What every `edgespec` command shares: the root parser (``--version``, ``-v``, defaults in ``--help``) and
the run (logging, config warnings, errors). The list of commands is the top package's (``edgespec.cli``), the
one floor that may name every other. A command's module defines ``register(subparsers)`` and imports heavy
things (torch, transformers) inside its handlers, so `edgespec --help` stays fast."""
from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType
from typing import Iterable

from . import __version__
from .config import LayeredParser
from .errors import EdgespecError
from .logging_setup import configure_logging


def build_parser(commands: Iterable[ModuleType]) -> argparse.ArgumentParser:
    """The `edgespec` parser with each of `commands` (modules with ``register``) as a subcommand, in order."""
    # Subparsers are built with the root's class: every command gets defaults in --help, and the
    # commands that call config.enable_layers read EDGESPEC_* variables and --config files.
    parser = LayeredParser(prog="edgespec", description="Client-server speculative decoding for edge devices.")
    parser.add_argument("--version", action="version", version=f"edgespec {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (same as --log-level debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        command.register(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse `argv` (the process's arguments when None) and run the chosen command's handler."""
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed: runs record the command that made them
    # One setup for every command; server and client add --log-format and --log-level.
    configure_logging(getattr(args, "log_format", "text"),
                      "debug" if args.verbose else getattr(args, "log_level", "info"))
    for warning in getattr(args, "config_warnings", ()):  # unknown EDGESPEC_* variables (config.unknown_env_warnings)
        logging.getLogger("edgespec.config").warning(warning)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
