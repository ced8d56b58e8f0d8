"""The flags of the commands whose options come from the config dataclasses, with their defaults, against a
snapshot taken from the hand-written parsers they replaced (tests/shared/data/cli_flags.json).

A flag that moved, lost a spelling, changed its default, type, choices or kind (switch, repeatable) fails here.
The snapshot is read from the parser objects, not from --help's wrapped text. To write it anew after an
intended change (say so in the commit): `python tests/shared/test_cli_flags_unchanged.py`.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

SNAPSHOT = Path(__file__).parent / "data" / "cli_flags.json"
# `client serve` and `client` share one parser (serve is its positional action); demo takes the client's options.
# A sub-command is named by its path ("bench multi-turn"); the bench and train commands' flags share helpers and
# come from their configs (BenchConfig, TrainConfig).
COMMANDS = ("server", "client", "demo",
            "bench speed", "bench link", "bench disconnect", "bench codec", "bench specbench", "bench report",
            "bench server", "bench drafting", "bench tree-sweep", "bench independent", "bench router", "bench beagle", "bench fit-speed",
            "bench activation-codec", "bench near-ties", "bench multi-turn", "bench constrained",
            "train data", "train features", "train fit", "train ship",
            "netem apply", "netem clear", "netem lab up", "netem lab down", "netem relay", "netem measure")


def _kind(action: argparse.Action) -> str:
    return type(action).__name__.lstrip("_")


def _type(action: argparse.Action) -> str:
    return "str" if action.type is None else getattr(action.type, "__name__", repr(action.type))


def describe(action: argparse.Action) -> dict:
    """What a flag is, from the parser object: every spelling, where it lands, its default and how it parses."""
    # Choices as a set: their order is only how --help lists them.
    choices = None if action.choices is None else sorted(str(c) for c in action.choices)
    default = json.loads(json.dumps(action.default, default=str))  # a Path as its text, a tuple as a list
    return {"option_strings": list(action.option_strings), "dest": action.dest, "default": default,
            "kind": _kind(action), "type": _type(action), "choices": choices, "nargs": action.nargs,
            "required": action.required}


def command_flags() -> dict[str, list[dict]]:
    from edgespec.cli import build_parser

    root, out = build_parser(), {}
    for name in COMMANDS:
        parser = root
        for word in name.split():
            parser = parser._subparsers._group_actions[0].choices[word]
        parser.format_help()  # a command whose options are added on first use has them now
        out[name] = [describe(a) for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    return out


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):  # the snapshot is of the parsers' own defaults
        if name.startswith("EDGESPEC_") and name != "EDGESPEC_HOME":
            monkeypatch.delenv(name)


@pytest.mark.parametrize("command", COMMANDS)
def test_flags_and_defaults_are_the_snapshots(command):
    want = {flag["dest"]: flag for flag in json.loads(SNAPSHOT.read_text())[command]}
    got = {flag["dest"]: flag for flag in command_flags()[command]}
    assert sorted(got) == sorted(want), f"`edgespec {command}`: flags added or gone"
    for dest, flag in want.items():
        assert got[dest] == flag, f"`edgespec {command}`: {flag['option_strings']} changed"


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(exist_ok=True)
    commands = command_flags()  # one flag a line, so that a change reads as one line of the diff
    SNAPSHOT.write_text("{\n" + ",\n".join(
        f"{json.dumps(name)}: [\n" + ",\n".join(json.dumps(flag) for flag in flags) + "\n]"
        for name, flags in commands.items()) + "\n}\n")
