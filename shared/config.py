"""Settings of a command from four places, generic over argparse.

Precedence: command line > ``EDGESPEC_*`` environment > ``--config FILE.yaml`` > the parser's default.

``enable_layers(parser)`` turns it on for one parser (``edgespec server``, ``edgespec client``):
every optional flag ``--some-flag`` can then also come from the variable ``EDGESPEC_SOME_FLAG``
or the key ``some-flag`` (or ``some_flag``) of the YAML file, a mapping of long option names to
values. Flags added by anyone, later, are covered without a line of their own. Values go through
the flag's own ``type`` and ``choices``; a bad value or an unknown key in the file is an error
that names it. Switches (``store_true``) take true/false, 1/0, yes/no, on/off; repeatable flags
(``append``) take a YAML list (``[a, b]`` in a variable too).

The environment and the file are read when the parser parses, never at import. An ``EDGESPEC_*``
variable that no option of any command reads, and that is not one of ``KNOWN_ENV``, is reported
(``Namespace.config_warnings``, logged once logging is set up), as vLLM warns about unknown ``VLLM_*``
variables: a misspelt variable is otherwise silently ignored.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

ENV_PREFIX = "EDGESPEC_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
# Variables that already mean something else: EDGESPEC_HOME is the model cache folder.
RESERVED_ENV = frozenset({ENV_PREFIX + "HOME"})
# Variables read by something other than a command's options: the model cache, the config file, and the
# deploy/ entrypoint's and compose files' own settings (which become flags or stay in the shell).
KNOWN_ENV = RESERVED_ENV | {CONFIG_ENV} | {ENV_PREFIX + name for name in (
    "CLIENT_PORT", "PREPARE", "DRY_RUN", "HEALTH_ROLE", "PROFILE", "RELAY_LISTEN", "RELAY_UPSTREAM",
    "PROXY_LISTEN", "PROXY_ACCESS_LOG", "UPSTREAMS", "SERVER_VARIANT", "CLIENT_PUBLISH", "SERVER_HTTP_PUBLISH")}
# Every layered parser made in this process: an unknown variable is one that none of them reads.
_LAYERED: list[argparse.ArgumentParser] = []
_PENDING: list["LayeredParser"] = []  # parsers with options add_on_first_use has not added yet
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
# Defaults of these options are not printed by --help: an API key from the environment would show. Only
# options that take a value can hold a secret (a switch such as --metrics-need-key holds none).
_SECRET = re.compile(r"(^|_)(key|token|password|secret)$")
# argparse actions whose value is "the flag was given" (const) rather than a parsed value.
_SWITCHES = (argparse._StoreConstAction, argparse.BooleanOptionalAction)
_SKIPPED = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


class ConfigError(ValueError):
    """A setting from the environment or the config file that the command cannot take."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in --help (secrets hidden); descriptions keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.nargs != 0 and _SECRET.search(action.dest) and action.default not in (None, argparse.SUPPRESS):
            return text + " (default: set, hidden)"
        # Nothing to add for an unset flag or a switch left as it is (its help says what giving it does: off for
        # --metrics-need-key, plots drawn for --no-plots), nor where the help already names the value in force (a
        # default the environment or config file changed is not named there, so it is still shown).
        shown = shown_default(action.default)
        value = re.escape(str(shown))
        if shown is None or (action.nargs == 0 and action.default != action.const) or re.search(
                rf"default:? {value}\b|(?<![\w.]){value}, the default", text):
            return text
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def shown_default(value: Any) -> Any:
    """A default as a user types it, never Python's repr: None where nothing is set (an empty list too), a list
    or tuple comma-separated (a None inside one is "never", as the disconnect benchmark's cut points spell it),
    a whole float without its ".0"."""
    if value is None or value is argparse.SUPPRESS:
        return None
    if isinstance(value, (list, tuple)):
        if not value:
            return None
        return ",".join(shown_default(v) or "never" for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def comma_list(values: list[str]) -> tuple[str, ...]:
    """A repeatable option's values, each of which may hold several comma-separated items, as one tuple."""
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def add_on_first_use(parser: argparse.ArgumentParser, add: Callable[[argparse.ArgumentParser], None]) -> None:
    """Call add(parser) when the parser first parses or shows its help, not now: `add` may import a config
    dataclass whose module imports torch, which `edgespec --help` and the other commands should not wait for.
    A parser that is not a LayeredParser gets its options now."""
    if isinstance(parser, LayeredParser):
        parser.pending.append(add)
        _PENDING.append(parser)
    else:
        add(parser)


def _known_env() -> set[str]:
    return set(KNOWN_ENV) | {n for p in _LAYERED for a in _layered_actions(p) for n in env_names(a)}


def unknown_env_warnings(environ: Mapping[str, str]) -> list[str]:
    """One line per EDGESPEC_* variable set in `environ` that no command's option and no part of edgespec
    reads, with the nearest known name when there is one."""
    if any(name.startswith(ENV_PREFIX) for name in set(environ) - _known_env()):
        while _PENDING:  # a command whose options are not added yet may read it
            _PENDING.pop().add_pending()
    known = _known_env()
    out = []
    for name in sorted(name for name in environ if name.startswith(ENV_PREFIX) and name not in known):
        near = difflib.get_close_matches(name, known, n=1)
        out.append(f"unknown environment variable {name}: no edgespec option reads it"
                   + (f" (did you mean {near[0]}?)" if near else ""))
    return out


@dataclass(frozen=True)
class Setting:
    """One value from a layer below the command line."""

    value: Any  # converted with the flag's type, as argparse would hand it over
    source: str  # where it came from, for error messages ("EDGESPEC_PORT", "cfg.yaml: port")


class LayeredParser(argparse.ArgumentParser):
    """An ArgumentParser whose defaults come from the environment and a config file once
    ``enable_layers`` was called on it; until then it only differs by showing defaults in --help
    (shared/cli.py makes the root parser one, so every subcommand parser is one too)."""

    def __init__(self, *args, **kwargs):
        # Commands that asked for raw descriptions get them, with defaults shown as everywhere else.
        if kwargs.get("formatter_class", argparse.RawDescriptionHelpFormatter) is argparse.RawDescriptionHelpFormatter:
            kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)
        self.layered = False  # set by enable_layers
        self.pending: list[Callable[[argparse.ArgumentParser], None]] = []  # add_on_first_use's, in order

    def add_pending(self) -> None:
        """Add the options add_on_first_use put off; a set_defaults made before them still wins."""
        while self.pending:
            self.pending.pop(0)(self)
            for action in self._actions:
                action.default = self._defaults.get(action.dest, action.default)

    def format_help(self) -> str:
        self.add_pending()
        return super().format_help()

    def parse_known_args(self, args=None, namespace=None):
        self.add_pending()
        if not self.layered:
            return super().parse_known_args(args, namespace)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            config_path = _config_path(argv, os.environ)
            settings = collect(self, os.environ, load_yaml(config_path) if config_path else {},
                               str(config_path or ""))
        except ConfigError as exc:
            self.error(str(exc))
        saved = {}
        repeated = {}
        for action in self._actions:
            if action.dest not in settings or action.dest == "config":
                continue
            saved[action] = (action.default, action.required)
            action.required = False
            value = settings[action.dest].value
            if isinstance(action, (argparse._AppendAction, argparse._ExtendAction)):
                # argparse appends command-line values to a list default; the command line must
                # replace the lower layers instead, so the default stays None and is filled in after.
                repeated[action.dest], value = value, None
            action.default = value
        try:
            ns, extras = super().parse_known_args(argv, namespace)
        finally:
            for action, (default, required) in saved.items():
                action.default, action.required = default, required
        for dest, value in repeated.items():
            if getattr(ns, dest, None) is None:
                setattr(ns, dest, list(value))
        given = getattr(ns, "config", None)
        if given is not None and (config_path is None or Path(given) != config_path):
            self.error(f"write --config in full (the file is read before the other options); got {given}")
        ns.config_warnings = unknown_env_warnings(os.environ)  # logged by the caller once logging is set up
        return ns, extras


def enable_layers(parser: argparse.ArgumentParser) -> None:
    """Let every flag of `parser` come from EDGESPEC_* variables and a --config YAML file."""
    if not isinstance(parser, LayeredParser):
        raise TypeError("enable_layers needs a LayeredParser (make the root parser one: "
                        "subparsers take the root's class)")
    for action in parser._actions:
        for name in env_names(action):
            if name in RESERVED_ENV:
                raise ValueError(f"{action.option_strings} would read {name}, which means something else")
    parser.add_argument("--config", metavar="FILE.yaml", default=None,
                        help=f"settings file: a YAML mapping of long option names to values (port: 8080); "
                             f"the environment (${CONFIG_ENV} names this file) and the command line win over it")
    parser.epilog = ((parser.epilog + "\n\n") if parser.epilog else "") + (
        f"Every option can also be set as {ENV_PREFIX}<OPTION> (--http-port: {ENV_PREFIX}HTTP_PORT)\n"
        f"or in --config FILE.yaml; precedence: command line > environment > config file > default.")
    parser.layered = True
    _LAYERED.append(parser)


def env_names(action: argparse.Action) -> list[str]:
    """EDGESPEC_* names of a flag: one per long option string (--max-context, --max-model-len)."""
    return [ENV_PREFIX + opt.lstrip("-").upper().replace("-", "_")
            for opt in action.option_strings if opt.startswith("--")]


def _layered_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if a.option_strings and not isinstance(a, _SKIPPED) and a.dest != "config"]


def collect(parser: argparse.ArgumentParser, environ: Mapping[str, str], file: Mapping[str, Any],
            file_name: str = "config") -> dict[str, Setting]:
    """dest -> Setting from the environment over the file; ConfigError names a bad key or value."""
    actions = _layered_actions(parser)
    by_key = {opt.lstrip("-").replace("_", "-"): a for a in actions for opt in a.option_strings if opt.startswith("--")}
    out: dict[str, Setting] = {}
    for key, raw in file.items():
        if str(key) == "config":
            raise ConfigError(f"{file_name}: a config file cannot name another (key 'config')")
        action = by_key.get(str(key).replace("_", "-"))
        if action is None:
            near = difflib.get_close_matches(str(key).replace("_", "-"), list(by_key), n=1)
            raise ConfigError(f"{file_name}: unknown key {key!r}: `{parser.prog}` has no --{key} option"
                              + (f" (did you mean {near[0]!r}?)" if near else ""))
        if raw is None:  # `key:` with no value leaves the default
            continue
        where = f"{file_name}: {key}"
        if action.dest in out:
            raise ConfigError(f"{where}: {out[action.dest].source} sets the same option")
        out[action.dest] = Setting(convert(action, raw, where), where)
    for action in actions:
        found = [(n, environ[n]) for n in env_names(action) if n in environ and n not in RESERVED_ENV]
        if len({value for _, value in found}) > 1:
            raise ConfigError(" and ".join(f"{n}={v!r}" for n, v in found) + " set the same option differently")
        if found:
            name, raw = found[0]
            out[action.dest] = Setting(convert(action, raw, name, from_env=True), name)
    return out


def convert(action: argparse.Action, raw: Any, where: str, from_env: bool = False) -> Any:
    """A value from a variable (a string) or the YAML file, as the command line would have given it."""
    if isinstance(action, _SWITCHES):
        on = _boolean(raw, where)
        if isinstance(action, argparse.BooleanOptionalAction):
            return on
        return action.const if on else action.default
    if isinstance(action, argparse._CountAction):
        return _one(action, raw, where, int)
    if action.nargs == 0:  # append_const and custom flag-only actions have no value to give
        raise ConfigError(f"{where}: {action.option_strings[0]} can only be given on the command line")
    many = isinstance(action, (argparse._AppendAction, argparse._ExtendAction)) or action.nargs in ("+", "*") \
        or isinstance(action.nargs, int)
    if many:
        if from_env and isinstance(raw, str):
            raw = _yaml_list(raw, where) if raw.lstrip().startswith("[") else [raw]
        items = raw if isinstance(raw, list) else [raw]
        return [_one(action, item, where) for item in items]
    if isinstance(raw, (list, dict)):
        raise ConfigError(f"{where}: {action.option_strings[0]} takes one value, got {raw!r}")
    return _one(action, raw, where)


def _one(action: argparse.Action, raw: Any, where: str, kind=None) -> Any:
    if isinstance(raw, (list, dict)):
        raise ConfigError(f"{where}: {action.option_strings[0]} takes plain values, got {raw!r}")
    kind = kind or action.type
    text = raw if isinstance(raw, str) else ("true" if raw is True else "false" if raw is False else str(raw))
    try:
        value = kind(text) if kind else text
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        name = getattr(kind, "__name__", "the option's type")
        raise ConfigError(f"{where}: {action.option_strings[0]} wants {name}, got {raw!r} ({exc})") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ConfigError(f"{where}: {action.option_strings[0]} is one of {choices}, got {raw!r}")
    return value


def _boolean(raw: Any, where: str) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigError(f"{where}: a switch takes true/false (1/0, yes/no, on/off), got {raw!r}")


def _yaml_list(text: str, where: str) -> list:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not a YAML list: {exc}") from None
    if not isinstance(value, list):
        raise ConfigError(f"{where}: not a YAML list: {text!r}")
    return value


def _config_path(argv: list[str], environ: Mapping[str, str]) -> Path | None:
    """--config FILE from the command line (up to a bare --), else $EDGESPEC_CONFIG."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a FILE.yaml")
            return Path(argv[i + 1])
        if arg.startswith("--config="):
            return Path(arg.partition("=")[2])
    return Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None


def load_yaml(path: Path) -> dict[str, Any]:
    """The config file as a mapping; ConfigError when it is missing, not YAML, or not a mapping."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"the config file {path} must be a mapping of option names to values, "
                          f"not a {type(data).__name__}")
    return data
