"""What shapes the link to a host, read back from the kernel: the interface the route to it leaves by and
the qdiscs `tc` shows on it, named as the profile `edgespec netem apply` installed where it matches one.

A benchmark against a server on another machine (`edgespec bench link --server HOST:PORT`) records this in
every line, so a result says which network it ran over: `4g` (netem with the 4g profile's "up" direction,
as `edgespec netem apply 4g --direction up` leaves it), `tc:<the qdisc line>` for shaping that is no
profile's (a tbf or htb rate limit, a netem of other values), `none` where tc shows nothing but the
kernel's default queues, and `unknown` where there is no tc or route to ask.
"""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass

from .profile import DirectionProfile, load_profile, profile_names

# Queues a kernel or a distribution sets up by itself: they shape nothing.
DEFAULT_QDISCS = {"noqueue", "fq_codel", "pfifo_fast", "mq", "fq", "pfifo", "bfifo", "ingress", "clsact",
                  "sfq", "codel", "cake_mq"}


@dataclass(frozen=True)
class LinkReadout:
    profile: str  # the profile's name, "tc:<qdisc>", "none" or "unknown"
    device: str  # the interface the route to the host leaves by ("" where unknown)
    qdiscs: tuple[str, ...]  # `tc qdisc show dev DEVICE`, one line each, default queues left out

    def to_dict(self) -> dict:
        return asdict(self)


def route_device(host: str) -> str:
    """The interface packets to `host` leave by (`ip route get`), or "" where it cannot tell."""
    if not shutil.which("ip"):
        return ""
    try:
        address = socket.getaddrinfo(host, None)[0][4][0]
    except OSError:
        return ""
    out = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True).stdout
    match = re.search(r"\bdev (\S+)", out)
    return match.group(1) if match else ""


def shaping_qdiscs(device: str) -> list[str]:
    """The qdisc lines of `device` that shape (the kernel's default queues left out)."""
    out = subprocess.run(["tc", "qdisc", "show", "dev", device], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.split()[1:2] and line.split()[1] not in DEFAULT_QDISCS]


def read_link(host: str) -> LinkReadout:
    """How the link from here to `host` is shaped, as tc shows it now."""
    device = route_device(host)
    if not device or not shutil.which("tc"):
        return LinkReadout("unknown", device, ())
    lines = shaping_qdiscs(device)
    if not lines:
        return LinkReadout("none", device, ())
    names = [profile_of(line) for line in lines]
    named = [n for n in names if n]
    return LinkReadout(named[0] if named else "tc:" + " / ".join(lines), device, tuple(lines))


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def _mbit(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)([KMG]?)bit", text, re.I).groups()
    return float(value) * {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}[unit.upper()]


def netem_values(line: str) -> dict | None:
    """delay, jitter (ms), loss (%) and rate (Mbit/s) of a `tc qdisc show` netem line; None for another qdisc."""
    if " netem " not in f" {line} ":
        return None
    values = {"delay_ms": 0.0, "jitter_ms": 0.0, "loss_percent": 0.0, "rate_mbit": None}
    if m := re.search(r"\bdelay ([\d.]+(?:us|ms|s))(?:\s+([\d.]+(?:us|ms|s)))?", line):
        values["delay_ms"] = _ms(m.group(1))
        values["jitter_ms"] = _ms(m.group(2)) if m.group(2) else 0.0
    if m := re.search(r"\bloss (?:random )?([\d.]+)%", line):
        values["loss_percent"] = float(m.group(1))
    if m := re.search(r"\brate ([\d.]+[KMG]?bit)", line, re.I):
        values["rate_mbit"] = _mbit(m.group(1))
    return values


def _direction_values(d: DirectionProfile) -> dict:
    return {"delay_ms": float(d.delay.mean_ms), "jitter_ms": float(d.delay.deviation_ms),
            "loss_percent": float(d.loss_percent), "rate_mbit": d.rate_mbit}


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 0.01 * max(abs(a), abs(b), 1e-9) + 1e-6  # tc rounds rates and times a little


def profile_of(line: str) -> str | None:
    """The shipped profile whose "up" or "down" direction this netem line is, or None."""
    values = netem_values(line)
    if values is None:
        return None
    for name in profile_names():
        profile = load_profile(name)
        for direction in ("up", "down"):
            want = _direction_values(profile.direction(direction))
            if all(_close(values[k], want[k]) for k in want):
                return name
    return None
