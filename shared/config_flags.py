"""Command-line flags made from a config dataclass's fields, and the dataclass made back from the parsed flags.

As vLLM's EngineArgs does with its configs, a field's type, default and comment become its flag, so a default
is written once, in the dataclass. The flag is named after the field, less a trailing ``_s`` (seconds); a
``Flag`` says where the command line differs: other spellings, a unit (--max-kv-gb for ``max_kv_bytes``), the
command's own default, its own help. A nested dataclass's field is named by its path ("sampling.temperature")
and gets the leaf's flag (--temperature).

Types: a bool is a switch (--x/--no-x where it may be None or defaults to True); ``X | None`` takes an X; a
Literal or an Enum its values (an Enum's names, lower case); ``tuple[X, ...]`` is a repeatable flag. Help is
``field(metadata={"help": ...})``, else the field's comment: the one on its line and the comment lines under it.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import inspect
import re
import types
import typing
from typing import Any, Callable, Literal, Mapping

# A field in bytes given in these on the command line: unit -> (bytes in one, the flag's suffix: --max-kv-gb).
UNITS = {"GiB": (1 << 30, "gb"), "MiB": (1 << 20, "mb")}
_FIELD_LINE = re.compile(r"\s+(\w+)\s*:[^#]*(?:#(.*))?$")  # name: type = default  # comment


class Flag:
    """How one field appears on the command line, where that differs from what the field says."""

    def __init__(self, *names: str, default: Any = dataclasses.MISSING, help: str | None = None,
                 unit: str | None = None, convert: Callable[[Any], Any] | None = None, **argparse_kwargs: Any):
        self.names = names  # option strings; none: from the field's name
        self.default = default  # the command's own default where it differs from the field's (a port)
        self.help = help  # None: the field's help metadata or comment
        self.unit = unit  # a field in bytes given in "GiB" or "MiB" (UNITS), as a float
        self.convert = convert  # the parsed value -> the field's, where the field's type does not say how
        self.argparse_kwargs = argparse_kwargs  # more add_argument keywords (metavar, action)

    def option_strings(self, path: str) -> tuple[str, ...]:
        name = path.rpartition(".")[2]
        name = f"{name.removesuffix('_bytes')}_{UNITS[self.unit][1]}" if self.unit else name.removesuffix("_s")
        return self.names or ("--" + name.replace("_", "-"),)

    def dest(self, path: str) -> str:
        return self.argparse_kwargs.get("dest") or self.option_strings(path)[0].lstrip("-").replace("-", "_")


def add_flags(parser: argparse.ArgumentParser, cls: type, flags: Mapping[str, Flag]) -> None:
    """One flag on `parser` per field path in `flags`, in their order."""
    for path, flag in flags.items():
        owner, f, kind, optional = _field(cls, path)
        default = _default(f) if flag.default is dataclasses.MISSING else flag.default
        text = flag.help or f.metadata.get("help") or field_comments(owner).get(f.name, "").replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": flag.dest(path)}
        if flag.unit:
            kwargs["type"], text = float, f"{text}, in {flag.unit}"
            default = default / UNITS[flag.unit][0] if flag.default is dataclasses.MISSING else default
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if optional or default is True else "store_true"
        elif typing.get_origin(kind) is Literal:
            kwargs["choices"] = list(typing.get_args(kind))
            kwargs["type"] = type(kwargs["choices"][0])
        elif isinstance(kind, enum.EnumMeta):
            kwargs["choices"], kwargs["type"] = [m.name.lower() for m in kind], str
            default = default.name.lower() if isinstance(default, enum.Enum) else default
        elif typing.get_origin(kind) in (tuple, list):
            kwargs["action"], kwargs["type"] = "append", typing.get_args(kind)[0]
        elif kind in (int, float, str):
            kwargs["type"] = kind
        elif not flag.convert:
            raise TypeError(f"{owner.__name__}.{f.name}: a {kind} field needs Flag(convert=..., ...) to be a flag")
        kwargs.update(flag.argparse_kwargs)
        if kwargs.get("action") == "append":
            default = None if default is None else list(default)  # argparse appends to a copy
            text += "" if "repeatable" in text else "; repeatable"
        parser.add_argument(*flag.option_strings(path), default=default, help=text, **kwargs)


def from_args(cls: type, args: argparse.Namespace, flags: Mapping[str, Flag], **given: Any) -> Any:
    """`cls` from the parsed `flags`; fields in `given` (what the caller read from the command line itself) win.
    A nested dataclass is built from its fields' flags, its other fields at their defaults."""
    kwargs: dict[str, Any] = {}
    nested: dict[str, dict[str, Flag]] = {}
    for path, flag in flags.items():
        head, _, rest = path.partition(".")
        if head in given:
            continue
        if rest:
            nested.setdefault(head, {})[rest] = flag
            continue
        _, f, kind, optional = _field(cls, path)
        value = getattr(args, flag.dest(path))
        if flag.convert:
            value = flag.convert(value)
        elif value is None:
            value = None if optional else _default(f)
        elif flag.unit:
            value = int(value * UNITS[flag.unit][0])
        elif isinstance(kind, enum.EnumMeta):
            value = kind[value.upper()]
        elif typing.get_origin(kind) is tuple:
            value = tuple(value)
        kwargs[path] = value
    for head, inner in nested.items():
        kwargs[head] = from_args(_hints(cls)[head], args, inner)
    return cls(**kwargs, **given)


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment (the one on its line, then the comment lines under it); {} without source."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    names, out, owner = {f.name for f in dataclasses.fields(cls)}, {}, None
    for line in lines:
        match = _FIELD_LINE.match(line)
        if match and match[1] in names:
            owner = match[1]
            out[owner] = (match[2] or "").strip()
        elif owner and line.lstrip().startswith("#"):
            out[owner] = f"{out[owner]} {line.lstrip()[1:].strip()}".strip()
        else:  # a blank line or another statement ends a field's comment
            owner = None
    return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _field(cls: type, path: str) -> tuple[type, dataclasses.Field, Any, bool]:
    """(the dataclass that holds it, the field, its type less ``| None``, whether it may be None)."""
    *outer, name = path.split(".")
    for part in outer:
        cls = _hints(cls)[part]
    found = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    if found is None:
        raise ValueError(f"{cls.__name__} has no field {name!r} (flag for {path!r})")
    kind = _hints(cls)[name]
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return cls, found, (rest[0] if len(rest) == 1 else kind), True
    return cls, found, kind, False


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return None if f.default_factory is dataclasses.MISSING else f.default_factory()
