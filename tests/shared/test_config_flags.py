"""Flags made from a config dataclass (shared/config_flags.py): names, types, defaults and help from the fields,
the dataclass back from the parsed flags, a nested dataclass flattened; and options added on first use."""
from __future__ import annotations

import argparse
import enum
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Literal

import pytest

from edgespec.shared.config import LayeredParser, add_on_first_use, enable_layers
from edgespec.shared.config_flags import Flag, add_flags, field_comments, from_args


class Policy(enum.Enum):
    KEEP = 0
    ROLLBACK = 1


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off


@dataclass(frozen=True)
class Settings:
    address: str  # HOST:PORT
    wait_s: float = 30.0  # seconds to wait, at 100%
    # of the time

    # After a blank line a comment is no longer the field's above it.
    verbose: bool = False  # say more
    buckets: bool | None = None  # unset: by device
    pipeline: bool = True  # draft ahead
    depth: int | None = None  # deepest level
    engine: Literal["auto", "fast"] = "auto"  # which engine
    policy: Policy = Policy.ROLLBACK  # on reconnect
    stop: tuple[str, ...] = ()  # stop strings
    kv_bytes: int = 8 << 30  # KV memory
    parts: dict[str, str] = field(default_factory=dict)  # name -> path
    sampling: Sampling = field(default_factory=Sampling)
    named: str = field(default="x", metadata={"help": "from the metadata"})  # not this comment

    def method(self) -> None:  # a method's comment is no field's
        pass


FLAGS = {"address": Flag("--server", default="h:1"), "wait_s": Flag(), "verbose": Flag(), "buckets": Flag(),
         "pipeline": Flag(), "depth": Flag(), "engine": Flag(), "policy": Flag(), "stop": Flag(),
         "kv_bytes": Flag(unit="GiB"), "sampling.temperature": Flag(), "named": Flag(),
         "parts": Flag("--part", action="append", convert=lambda specs: dict(s.split("=") for s in specs or ()))}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_flags(p, Settings, FLAGS)
    return p


def test_names_types_and_defaults_come_from_the_fields():
    actions = {a.dest: a for a in parser()._actions}
    assert actions["wait"].option_strings == ["--wait"] and actions["wait"].default == 30.0  # _s is the unit
    assert actions["kv_gb"].option_strings == ["--kv-gb"] and actions["kv_gb"].default == 8.0
    assert isinstance(actions["verbose"], argparse._StoreTrueAction)
    assert isinstance(actions["buckets"], argparse.BooleanOptionalAction) and actions["buckets"].default is None
    assert isinstance(actions["pipeline"], argparse.BooleanOptionalAction) and actions["pipeline"].default is True
    assert (actions["depth"].type, actions["depth"].default) == (int, None)
    assert actions["engine"].choices == ["auto", "fast"]
    assert (actions["policy"].choices, actions["policy"].default) == (["keep", "rollback"], "rollback")
    assert isinstance(actions["stop"], argparse._AppendAction) and actions["stop"].default == []
    assert (actions["temperature"].option_strings, actions["temperature"].default) == (["--temperature"], 0.0)
    assert (actions["server"].default, actions["part"].default) == ("h:1", [])


def test_help_is_the_fields_comment_or_metadata():
    helps = {a.dest: a.help for a in parser()._actions}
    assert helps["wait"] == "seconds to wait, at 100%% of the time"  # argparse formats help with %
    assert helps["named"] == "from the metadata" and helps["kv_gb"] == "KV memory, in GiB"
    assert helps["stop"] == "stop strings; repeatable" and helps["temperature"] == "0 = greedy"
    assert helps["verbose"] == "say more"
    assert "method" not in field_comments(Settings) and field_comments(Settings)["address"] == "HOST:PORT"
    assert "100%" in parser().format_help()


def test_the_dataclass_comes_back_from_the_parsed_flags():
    args = parser().parse_args(["--wait", "2.5", "--verbose", "--no-buckets", "--no-pipeline", "--depth", "3",
                                "--engine", "fast", "--policy", "keep", "--stop", "a", "--stop", "b",
                                "--kv-gb", "0.5", "--temperature", "0.7", "--part", "x=y"])
    got = from_args(Settings, args, FLAGS, named="given")
    assert got == Settings(address="h:1", wait_s=2.5, verbose=True, buckets=False, pipeline=False, depth=3,
                           engine="fast", policy=Policy.KEEP, stop=("a", "b"), kv_bytes=512 << 20,
                           parts={"x": "y"}, sampling=Sampling(temperature=0.7), named="given")
    assert from_args(Settings, parser().parse_args([]), FLAGS) == Settings(address="h:1")  # the fields' defaults


def test_a_field_the_generator_cannot_type_is_named():
    with pytest.raises(TypeError, match=r"Settings.parts: a dict\[str, str\] field needs Flag\(convert"):
        add_flags(argparse.ArgumentParser(), Settings, {"parts": Flag()})
    with pytest.raises(ValueError, match="Sampling has no field 'top_p'"):
        add_flags(argparse.ArgumentParser(), Settings, {"sampling.top_p": Flag()})


def test_options_added_on_first_use_keep_earlier_defaults_and_read_the_environment(monkeypatch):
    p = LayeredParser(prog="x")
    calls = []

    def add(parser):
        calls.append(parser)
        add_flags(parser, Settings, {"wait_s": Flag(), "engine": Flag()})
        enable_layers(parser)

    add_on_first_use(p, add)
    p.set_defaults(engine="fast")  # as demo sets the client options' --drafter
    assert calls == []
    monkeypatch.setenv("EDGESPEC_WAIT", "4")
    args = p.parse_args([])
    assert (args.wait, args.engine, len(calls)) == (4.0, "fast", 1)
    assert "--wait" in p.format_help() and len(calls) == 1


def test_the_command_line_help_imports_no_torch():
    """The client's options come from dataclasses in modules that import torch: they are added when the client
    command is used, so `edgespec --help` and `edgespec server --help` stay quick."""
    code = ("import contextlib, io, sys\nfrom edgespec.cli import build_parser\n"
            "for argv in (['--help'], ['server', '--help']):\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "        build_parser().parse_args(argv)\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
