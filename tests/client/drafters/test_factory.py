"""One place builds a drafter by name (client/drafters/factory.py): every name the command line offers and the
benchmarks run is one the factory knows, and every name the factory knows is built, or its checkpoint opened,
by make_drafter."""
from __future__ import annotations

import argparse
import re

import pytest

from edgespec.client.drafters.factory import (BUILTIN, DrafterOptions, UnknownDrafterError, available_drafters,
                                              make_drafter)
from edgespec.shared.drafters.checkpoint import DrafterCheckpointError


def drafter_flags(parser: argparse.ArgumentParser, path=()):
    """(command words, the --drafter action) of every command under `parser` that takes --drafter."""
    if hasattr(parser, "add_pending"):  # options a command adds on first use (shared.config.add_on_first_use)
        parser.add_pending()
    for action in parser._actions:
        if "--drafter" in action.option_strings:
            yield " ".join(path), action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from drafter_flags(sub, (*path, name))


def named_in(help_text: str) -> set[str]:
    """The drafter names a --drafter help lists: the single words between its | , and : separators."""
    return {w.strip() for w in re.split(r"[|,:]", help_text) if re.fullmatch(r"\s*[a-z][a-z0-9-]*\s*", w)}


def test_the_command_line_offers_exactly_the_factorys_drafters():
    from edgespec.cli import build_parser

    found = dict(drafter_flags(build_parser()))
    for command, action in found.items():  # every command that takes a drafter's name (a benchmark too)
        assert action.default in available_drafters(), command
    for command in ("client", "demo"):  # `client serve` is `client`'s parser
        assert named_in(found[command].help) == set(available_drafters()), (command, found[command].help)


def test_the_drafting_benchmark_runs_drafters_by_the_factorys_names():
    from edgespec.netem.bench.drafting import EDGESPEC

    assert set(EDGESPEC) <= set(available_drafters())


@pytest.mark.parametrize("name", available_drafters())
def test_every_name_is_built_by_the_factory(name, tiny_model_dir, tiny_drafter_dir):
    options = DrafterOptions(name, model=str(tiny_drafter_dir), target=str(tiny_model_dir), dtype="float32")
    if name in BUILTIN:
        assert make_drafter(options).name == name
        return
    # A learned name opens its checkpoint: a shipped one was trained for the real target, which the tiny
    # target does not fit (a kind without a shipped checkpoint names the shipped ones).
    with pytest.raises(DrafterCheckpointError, match="another target|trained for a target with|shipped: "):
        make_drafter(options)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownDrafterError, match="choose one of ngram, independent, eagle"):
        make_drafter(DrafterOptions("medusa"))
