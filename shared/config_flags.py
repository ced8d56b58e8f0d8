"""Command-line flags made from a config dataclass's fields, and the dataclass made back from parsed flags.

As vLLM's EngineArgs does with its configs, a field's type, default and comment become its flag, so a default
is written once, in the dataclass:

    FLAGS = {"host": Flag(), "max_kv_bytes": Flag(unit="GiB"), "port": Flag("--grpc-port", default=50051)}
    add_flags(parser, ServerConfig, FLAGS)  # --host, --max-kv-gb, --grpc-port
    config = from_args(ServerConfig, parser.parse_args(), FLAGS, model="m")

A flag is named after its field, less a trailing ``_s`` (seconds): ``session_ttl_s`` is --session-ttl. A ``Flag``
says where the command line differs: other spellings, a unit, the command's own default, help of its own. A
field of a nested dataclass is named by its path ("sampling.temperature") and gets the leaf's flag
(--temperature); ``from_args`` builds the nested dataclass, its other fields at their defaults.

Types: a bool is a switch (store_true; --x/--no-x where it may be None or defaults to True); ``X | None`` takes
an X; a Literal or an Enum takes its values (an Enum's names in lower case); ``tuple[X, ...]`` is a repeatable
flag. Help is the field's ``metadata["help"]``, else its comment: the one on its line and the comment lines
under it.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import inspect
import io
import textwrap
import tokenize
import types
import typing
from typing import Any, Callable, Literal, Mapping

# A field in bytes given in these on the command line: unit -> (bytes in one, the flag's suffix: --max-kv-gb).
UNITS = {"GiB": (1 << 30, "gb"), "MiB": (1 << 20, "mb")}


class Flag:
    """How one field appears on the command line, where that differs from what the field says."""

    def __init__(self, *names: str, default: Any = dataclasses.MISSING, help: str | None = None,
                 unit: str | None = None, convert: Callable[[Any], Any] | None = None, **argparse_kwargs: Any):
        if unit is not None and unit not in UNITS:
            raise ValueError(f"unit {unit!r} is not one of {', '.join(UNITS)}")
        self.names = names  # option strings; none: from the field's name
        self.default = default  # the command's own default where it differs from the field's (a port)
        self.help = help  # None: the field's help metadata or comment
        self.unit = unit  # a field in bytes given in "GiB" or "MiB": --<name less _bytes>-gb, a float
        self.convert = convert  # the parsed value -> the field's, where the field's type does not say how
        self.argparse_kwargs = argparse_kwargs  # more add_argument keywords (metavar, action)

    def option_strings(self, path: str) -> tuple[str, ...]:
        if self.names:
            return self.names
        name = path.rpartition(".")[2]
        name = f"{name.removesuffix('_bytes')}_{UNITS[self.unit][1]}" if self.unit else name.removesuffix("_s")
        return ("--" + name.replace("_", "-"),)

    def dest(self, path: str) -> str:
        return self.argparse_kwargs.get("dest") or self.option_strings(path)[0].lstrip("-").replace("-", "_")


def add_flags(parser: argparse.ArgumentParser, cls: type, flags: Mapping[str, Flag]) -> None:
    """One flag on `parser` per field path in `flags`, in their order."""
    for path, flag in flags.items():
        parser.add_argument(*flag.option_strings(path), **_argparse_kwargs(cls, path, flag))


def from_args(cls: type, args: argparse.Namespace, flags: Mapping[str, Flag], **given: Any) -> Any:
    """`cls` from the parsed `flags`; fields in `given` (what the caller read from the command line itself) win."""
    values: dict[str, Any] = {}
    for path, flag in flags.items():
        if path.partition(".")[0] not in given:
            values[path] = _to_field(cls, path, flag, getattr(args, flag.dest(path)))
    return _build(cls, values, given)


def field_default(cls: type, path: str) -> Any:
    """The field's default (its factory's value); None for a field without one."""
    _, f, _ = _field(cls, path)
    if f.default is not dataclasses.MISSING:
        return f.default
    return None if f.default_factory is dataclasses.MISSING else f.default_factory()


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment (the one on its line, then the comment lines under it); {} without source."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    owners = {line: node.target.id for node in ast.parse(source).body[0].body
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              for line in range(node.lineno, node.end_lineno + 1)}
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    out: dict[str, str] = {}
    owner = None
    for number, line in enumerate(source.splitlines(), 1):
        if number in owners:
            owner = owners[number]
        elif not line.lstrip().startswith("#"):  # a blank line or another statement ends a field's comment
            owner = None
        if owner and number in comments:
            out[owner] = f"{out.get(owner, '')} {comments[number]}".strip()
    return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _field(cls: type, path: str) -> tuple[type, dataclasses.Field, Any]:
    """(the dataclass that holds it, the field, its type) for "name" or "nested.name"."""
    *outer, name = path.split(".")
    for part in outer:
        cls = _hints(cls)[part]
    found = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    if found is None:
        raise ValueError(f"{cls.__name__} has no field {name!r} (flag for {path!r})")
    return cls, found, _hints(cls)[name]


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(X, True) for ``X | None``; (hint, False) otherwise."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else hint), True
    return hint, False


def _is_enum(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, enum.Enum)


def _argparse_kwargs(cls: type, path: str, flag: Flag) -> dict[str, Any]:
    owner, f, hint = _field(cls, path)
    kind, optional = _unwrap(hint)
    default = field_default(owner, f.name) if flag.default is dataclasses.MISSING else flag.default
    text = flag.help or f.metadata.get("help") or field_comments(owner).get(f.name, "").replace("%", "%%")
    out: dict[str, Any] = {"dest": flag.dest(path), "help": text}
    if flag.unit:
        out.update(type=float, help=f"{text}, in {flag.unit}")
        if flag.default is dataclasses.MISSING and default is not None:
            default = default / UNITS[flag.unit][0]
    elif kind is bool:
        out["action"] = argparse.BooleanOptionalAction if optional or default is True else "store_true"
    elif typing.get_origin(kind) is Literal:
        values = typing.get_args(kind)
        out.update(choices=list(values), type=type(values[0]))
    elif _is_enum(kind):
        out.update(choices=[m.name.lower() for m in kind], type=str)
        default = default.name.lower() if isinstance(default, enum.Enum) else default
    elif typing.get_origin(kind) in (tuple, list):
        out.update(action="append", type=typing.get_args(kind)[0])
    elif kind in (int, float, str):
        out["type"] = kind
    elif not flag.convert:
        raise TypeError(f"{owner.__name__}.{f.name}: a {hint} field needs Flag(convert=..., ...) to be a flag")
    out.update(flag.argparse_kwargs)
    if out.get("action") == "append" and "repeatable" not in out["help"]:
        out["help"] += "; repeatable"
    if out.get("action") == "append" and default is not None:
        default = list(default)  # argparse appends to a copy of it
    out["default"] = default
    return out


def _to_field(cls: type, path: str, flag: Flag, value: Any) -> Any:
    """A parsed flag's value as its field takes it."""
    owner, f, hint = _field(cls, path)
    kind, optional = _unwrap(hint)
    if flag.convert:
        return flag.convert(value)
    if value is None:
        return None if optional else field_default(owner, f.name)
    if flag.unit:
        return int(value * UNITS[flag.unit][0])
    if _is_enum(kind):
        return kind[value.upper()]
    if typing.get_origin(kind) is tuple:
        return tuple(value)
    return value


def _build(cls: type, values: Mapping[str, Any], given: Mapping[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            kwargs[head] = value
    for head, inner in nested.items():
        kwargs[head] = _build(_hints(cls)[head], inner, {})
    return cls(**kwargs, **given)
