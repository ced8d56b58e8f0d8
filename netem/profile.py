"""Network profiles: what a link does to bytes, per direction, read from YAML.

A profile file looks like::

    name: 4g
    description: ...
    both:                       # applies to up and down; `up:` / `down:` override fields
      delay: {distribution: normal, mean_ms: 21, deviation_ms: 19}
      rate_mbit: 20             # omitted or null: no rate limit
      loss_percent: 0.1
      trace: {file: x.csv, format: csv}      # optional; drives rate (and delay) over time
    outages:                    # optional
      kind: fixed               # or poisson
      mode: blackhole           # or reset
      windows: [{start_s: 10, duration_s: 5}]

"up" is client -> server, "down" is server -> client. Every field is checked on
load, and an error names the file and the field that is wrong.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from edgespec.shared.errors import EdgespecError

DISTRIBUTIONS = ("normal", "uniform", "pareto")
OUTAGE_KINDS = ("fixed", "poisson")
OUTAGE_MODES = ("blackhole", "reset")
TRACE_FORMATS = ("mahimahi", "csv")
DIRECTIONS = ("up", "down")

# Linux never waits less than 200 ms before retransmitting (TCP_RTO_MIN), and a
# settled RTO is about srtt + 4*rttvar, i.e. a few RTTs: we take the larger.
MIN_RTO_S = 0.2
RTO_RTT_MULTIPLE = 3.0


class ProfileError(EdgespecError, ValueError, grpc_code="INVALID_ARGUMENT"):
    """A profile that cannot be used: unknown name, unreadable file or a bad field."""


@dataclass(frozen=True)
class DelaySpec:
    """One-way delay added to every chunk."""

    distribution: str = "normal"  # normal (clamped at 0, as netem does), uniform, or pareto
    mean_ms: float = 0.0  # centre of the distribution, milliseconds
    deviation_ms: float = 0.0  # normal: std dev; uniform: half-width; pareto: std dev

    def expected_ms(self) -> float:
        """The mean of what is actually drawn (after clamping at 0)."""
        mu, s = self.mean_ms, self.deviation_ms
        if s == 0 or self.distribution == "pareto":
            return mu
        if self.distribution == "normal":
            z = mu / s
            pdf = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
            cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
            return mu * cdf + s * pdf
        lo, hi = mu - s, mu + s  # uniform
        if lo >= 0:
            return mu
        return hi * hi / (2 * (hi - lo))


@dataclass(frozen=True)
class TraceSpec:
    """A recorded link to replay: rate over time, and for CSV traces also the delay."""

    path: Path  # resolved file path
    format: str  # "mahimahi" (ms timestamps of 1500-byte delivery slots) or "csv" (one row a second)
    throughput_column: str = "DL_bitrate"  # csv: column with the throughput
    throughput_unit: str = "kbit"  # csv: unit of that column, "kbit" or "mbit" (per second)
    rtt_column: str | None = None  # csv: column with the RTT in ms; its half replaces delay.mean_ms


@dataclass(frozen=True)
class DirectionProfile:
    """What the link does to the bytes going one way."""

    delay: DelaySpec = field(default_factory=DelaySpec)
    rate_mbit: float | None = None  # bottleneck rate in Mbit/s; None = unlimited
    loss_percent: float = 0.0  # chance (in %) a chunk is lost and pays one retransmission timeout
    trace: TraceSpec | None = None  # when set, the trace drives rate (and maybe delay) over time


@dataclass(frozen=True)
class OutageSchedule:
    """When the link goes down on its own."""

    kind: str = "fixed"  # "fixed" windows, or "poisson" on/off periods
    mode: str = "blackhole"  # "blackhole": bytes stop, sockets stay open; "reset": connections closed
    windows: tuple[tuple[float, float], ...] = ()  # fixed: (start_s, duration_s) from relay start
    mean_up_s: float = 0.0  # poisson: mean time the link stays up
    mean_down_s: float = 0.0  # poisson: mean length of an outage


@dataclass(frozen=True)
class NetworkProfile:
    name: str
    up: DirectionProfile  # client -> server
    down: DirectionProfile  # server -> client
    description: str = ""
    outages: OutageSchedule | None = None
    rto_ms: float | None = None  # retransmission timeout paid by a lost chunk; None = auto
    source: str = ""  # where it was loaded from

    def direction(self, name: str) -> DirectionProfile:
        if name not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {name!r}")
        return self.up if name == "up" else self.down

    def rto_s(self) -> float:
        """Extra delay of a lost chunk: max(200 ms, 3 x mean RTT) unless the profile says."""
        if self.rto_ms is not None:
            return self.rto_ms / 1000
        rtt_ms = self.up.delay.expected_ms() + self.down.delay.expected_ms()  # both one-way delays, no loss
        return max(MIN_RTO_S, RTO_RTT_MULTIPLE * rtt_ms / 1000)

    def expected_one_way_ms(self, name: str) -> float:
        """Mean one-way delay of a small message, loss included."""
        d = self.direction(name)
        return d.delay.expected_ms() + d.loss_percent / 100 * self.rto_s() * 1000


def profiles_dir() -> Path:
    return Path(str(resources.files("edgespec.netem") / "profiles"))


def traces_dir() -> Path:
    return Path(str(resources.files("edgespec.netem") / "traces"))


def profile_names() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> NetworkProfile:
    """A packaged profile by name ("4g", "5g", ...) or a YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        packaged = profiles_dir() / f"{name_or_path}.yaml"
        if not packaged.exists():
            raise ProfileError(f"unknown network profile {str(name_or_path)!r}: packaged profiles are "
                               f"{', '.join(profile_names())}, or give the path of a YAML file")
        path = packaged
    if not path.is_file():
        raise ProfileError(f"network profile file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"network profile {str(path)!r} is not valid YAML: {exc}") from exc
    return parse_profile(data, source=str(path), default_name=path.stem, base_dir=path.parent)


def parse_profile(data: Any, source: str = "<dict>", default_name: str = "custom",
                  base_dir: Path | None = None) -> NetworkProfile:
    """A profile from already-parsed YAML; errors name `source` and the field."""
    p = _Parser(source, base_dir or Path("."))
    top = p.mapping(data, "", {"name", "description", "both", "up", "down", "outages", "rto_ms"})
    if not any(k in top for k in ("both", "up", "down")):
        p.fail("", "needs `both:` or `up:` and `down:` with the link's delay, rate and loss")
    both = p.mapping(top.get("both", {}), "both", _DIRECTION_KEYS)
    p.direction(both, "both")  # checked on its own first, so its errors name `both.`
    directions = {}
    for name in DIRECTIONS:
        own = p.mapping(top.get(name, {}), name, _DIRECTION_KEYS)
        merged = {**both, **own}
        if "delay" in both and "delay" in own:  # let `up: {delay: {mean_ms: 5}}` override one field
            merged["delay"] = {**p.mapping(both["delay"], "both.delay", _DELAY_KEYS),
                               **p.mapping(own["delay"], f"{name}.delay", _DELAY_KEYS)}
        directions[name] = p.direction(merged, name)
    outages = p.outages(top["outages"], "outages") if top.get("outages") is not None else None
    rto = top.get("rto_ms")
    return NetworkProfile(
        name=p.string(top.get("name", default_name), "name"),
        description=p.string(top.get("description", ""), "description"),
        up=directions["up"], down=directions["down"], outages=outages,
        rto_ms=None if rto is None else p.number(rto, "rto_ms", minimum=0),
        source=source)


_DIRECTION_KEYS = {"delay", "rate_mbit", "loss_percent", "trace"}
_DELAY_KEYS = {"distribution", "mean_ms", "deviation_ms"}


class _Parser:
    """Field checks that raise ProfileError naming the file and the dotted field."""

    def __init__(self, source: str, base_dir: Path):
        self.source, self.base_dir = source, base_dir

    def fail(self, where: str, what: str):
        field_name = f" field `{where}`" if where else ""
        raise ProfileError(f"network profile {self.source!r}:{field_name} {what}")

    def mapping(self, value: Any, where: str, allowed: set[str]) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"must be a mapping, got {value!r}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            where_u = f"{where}.{unknown[0]}" if where else str(unknown[0])
            self.fail(where_u, f"is not a known field (known here: {', '.join(sorted(allowed))})")
        return value

    def number(self, value: Any, where: str, minimum: float = 0.0, maximum: float | None = None,
               strict_min: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            self.fail(where, f"must be a number, got {value!r}")
        too_low = value <= minimum if strict_min else value < minimum
        if too_low or (maximum is not None and value > maximum) or math.isinf(value):
            bound = f"> {minimum}" if strict_min else f">= {minimum}"
            rng = f"{bound} and <= {maximum}" if maximum is not None else bound
            self.fail(where, f"must be {rng}, got {value!r}")
        return float(value)

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            self.fail(where, f"must be a string, got {value!r}")
        return value

    def choice(self, value: Any, where: str, options: tuple[str, ...]) -> str:
        if value not in options:
            self.fail(where, f"must be one of {', '.join(options)}, got {value!r}")
        return value

    def direction(self, d: dict, where: str) -> DirectionProfile:
        delay = self.mapping(d.get("delay", {}), f"{where}.delay", _DELAY_KEYS)
        spec = DelaySpec(
            distribution=self.choice(delay.get("distribution", "normal"), f"{where}.delay.distribution",
                                     DISTRIBUTIONS),
            mean_ms=self.number(delay.get("mean_ms", 0), f"{where}.delay.mean_ms"),
            deviation_ms=self.number(delay.get("deviation_ms", 0), f"{where}.delay.deviation_ms"))
        rate = d.get("rate_mbit")
        return DirectionProfile(
            delay=spec,
            rate_mbit=None if rate is None else self.number(rate, f"{where}.rate_mbit", strict_min=True),
            loss_percent=self.number(d.get("loss_percent", 0), f"{where}.loss_percent", maximum=100),
            trace=None if d.get("trace") is None else self.trace(d["trace"], f"{where}.trace"))

    def trace(self, t: Any, where: str) -> TraceSpec:
        t = self.mapping(t, where, {"file", "format", "throughput_column", "throughput_unit",
                                    "rtt_column"})
        if "file" not in t:
            self.fail(f"{where}.file", "is required: the path of the trace file")
        name = self.string(t["file"], f"{where}.file")
        candidates = [Path(name), self.base_dir / name, traces_dir() / name]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            self.fail(f"{where}.file", f"names no file: looked for {', '.join(map(str, candidates))}")
        fmt = t.get("format", "csv" if name.endswith(".csv") else "mahimahi")
        rtt = t.get("rtt_column")
        return TraceSpec(
            path=path, format=self.choice(fmt, f"{where}.format", TRACE_FORMATS),
            throughput_column=self.string(t.get("throughput_column", "DL_bitrate"),
                                          f"{where}.throughput_column"),
            throughput_unit=self.choice(t.get("throughput_unit", "kbit"), f"{where}.throughput_unit",
                                        ("kbit", "mbit")),
            rtt_column=None if rtt is None else self.string(rtt, f"{where}.rtt_column"))

    def outages(self, o: Any, where: str) -> OutageSchedule:
        o = self.mapping(o, where, {"kind", "mode", "windows", "mean_up_s", "mean_down_s"})
        kind = self.choice(o.get("kind", "fixed"), f"{where}.kind", OUTAGE_KINDS)
        mode = self.choice(o.get("mode", "blackhole"), f"{where}.mode", OUTAGE_MODES)
        if kind == "poisson":
            return OutageSchedule(
                kind=kind, mode=mode,
                mean_up_s=self.number(o.get("mean_up_s"), f"{where}.mean_up_s", strict_min=True),
                mean_down_s=self.number(o.get("mean_down_s"), f"{where}.mean_down_s", strict_min=True))
        windows = o.get("windows")
        if not isinstance(windows, list) or not windows:
            self.fail(f"{where}.windows", f"must be a non-empty list of {{start_s, duration_s}}, got {windows!r}")
        parsed = []
        for i, w in enumerate(windows):
            w = self.mapping(w, f"{where}.windows[{i}]", {"start_s", "duration_s"})
            parsed.append((self.number(w.get("start_s"), f"{where}.windows[{i}].start_s"),
                           self.number(w.get("duration_s"), f"{where}.windows[{i}].duration_s",
                                       strict_min=True)))
        return OutageSchedule(kind=kind, mode=mode, windows=tuple(sorted(parsed)))
