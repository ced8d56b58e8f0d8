"""The same profiles on a real Linux host, with tc's netem qdisc.

- `apply_commands`: shape the egress of one interface with one direction.
- `lab_up_commands`: two network namespaces (client side, server side) joined by
  a veth pair, each end shaping what it sends: the client end applies "up", the
  server end "down".

The command builders are pure (the `--dry-run` output and the tests use them);
`run_commands` executes them. netem is a kernel module that many containers and
CI kernels lack; `probe_netem` finds out by trying, and the callers refuse to
start with a message that points at the userspace relay.

What tc cannot do here: traces and outage schedules are replayed by the relay
only (`notes_for`). netem's own jitter may reorder packets when no rate is set;
TCP copes, the relay never reorders.
"""
from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from edgespec.shared.errors import EdgespecError

from .profile import DirectionProfile, NetworkProfile


class NetemUnavailableError(EdgespecError, RuntimeError, grpc_code="FAILED_PRECONDITION"):
    """This host cannot apply a profile with tc (no netem qdisc, no iproute2, not root)."""


class TcCommandError(EdgespecError, RuntimeError):
    """An ip/tc command failed; the message holds the command and what it printed."""


@dataclass(frozen=True)
class LabConfig:
    """Names and addresses of the two-namespace lab."""

    name: str = "es"  # prefix of the namespaces (<name>-client, <name>-server) and veth ends
    subnet: str = "10.77.0.0/24"  # the veth pair's subnet: client gets .1, server .2

    @property
    def client_ns(self) -> str:
        return f"{self.name}-client"

    @property
    def server_ns(self) -> str:
        return f"{self.name}-server"

    @property
    def client_dev(self) -> str:
        return f"{self.name}-c"

    @property
    def server_dev(self) -> str:
        return f"{self.name}-s"

    def addresses(self) -> tuple[str, str, int]:
        """(client address, server address, prefix length)."""
        net = ipaddress.ip_network(self.subnet)
        if net.num_addresses < 4:
            raise ValueError(f"lab subnet {self.subnet} is too small for two hosts")
        return str(net[1]), str(net[2]), net.prefixlen


def netem_args(d: DirectionProfile) -> list[str]:
    """netem's parameters for one direction: delay [jitter [distribution]], loss, rate."""
    args: list[str] = []
    spec = d.delay
    if spec.mean_ms or spec.deviation_ms:
        args += ["delay", f"{spec.mean_ms:g}ms"]
        if spec.deviation_ms:
            args.append(f"{spec.deviation_ms:g}ms")
            if spec.distribution != "uniform":  # netem's jitter is uniform unless told otherwise
                args += ["distribution", spec.distribution]
    if d.loss_percent:
        args += ["loss", f"{d.loss_percent:g}%"]
    if (mbit := d.rate_mbit) is not None:  # whole Mbit/s in mbit, else in kbit (to the bit)
        args += ["rate", f"{mbit:g}mbit" if mbit == int(mbit) else f"{round(mbit * 1000, 3):g}kbit"]
    return args


def apply_commands(profile: NetworkProfile, dev: str, direction: str = "up",
                   netns: str | None = None) -> list[list[str]]:
    """Shape what `dev` sends with `direction` of the profile (replace: safe to rerun)."""
    ns = ["-n", netns] if netns else []
    return [["tc", *ns, "qdisc", "replace", "dev", dev, "root", "netem",
             *netem_args(profile.direction(direction))]]


def clear_commands(dev: str) -> list[list[str]]:
    return [["tc", "qdisc", "del", "dev", dev, "root"]]


def lab_up_commands(profile: NetworkProfile, lab: LabConfig = LabConfig()) -> list[list[str]]:
    client_ip, server_ip, plen = lab.addresses()
    c, s = lab.client_ns, lab.server_ns
    return [
        ["ip", "netns", "add", c],
        ["ip", "netns", "add", s],
        ["ip", "link", "add", lab.client_dev, "type", "veth", "peer", "name", lab.server_dev],
        ["ip", "link", "set", lab.client_dev, "netns", c],
        ["ip", "link", "set", lab.server_dev, "netns", s],
        ["ip", "-n", c, "addr", "add", f"{client_ip}/{plen}", "dev", lab.client_dev],
        ["ip", "-n", s, "addr", "add", f"{server_ip}/{plen}", "dev", lab.server_dev],
        ["ip", "-n", c, "link", "set", "lo", "up"],
        ["ip", "-n", s, "link", "set", "lo", "up"],
        ["ip", "-n", c, "link", "set", lab.client_dev, "up"],
        ["ip", "-n", s, "link", "set", lab.server_dev, "up"],
        *apply_commands(profile, lab.client_dev, "up", netns=c),
        *apply_commands(profile, lab.server_dev, "down", netns=s),
    ]


def lab_down_commands(lab: LabConfig = LabConfig()) -> list[list[str]]:
    """Deleting the namespaces deletes the veth pair and its qdiscs with them."""
    return [["ip", "netns", "del", lab.client_ns], ["ip", "netns", "del", lab.server_ns]]


def format_commands(commands: list[list[str]]) -> str:
    return "\n".join(shlex.join(c) for c in commands)


def notes_for(profile: NetworkProfile) -> list[str]:
    """What the profile asks for that tc will not do."""
    notes = []
    for name in ("up", "down"):
        if profile.direction(name).trace is not None:
            notes.append(f"{name}: the trace is replayed by the relay only; tc applies the "
                         f"profile's fixed delay, rate and loss")
    if profile.outages is not None:
        notes.append("outages: schedules are followed by the relay only; cut a lab link by hand "
                     "with `ip -n <ns> link set <dev> down`")
    return notes


def lab_instructions(profile: NetworkProfile, lab: LabConfig = LabConfig()) -> str:
    client_ip, server_ip, _ = lab.addresses()
    c, s = lab.client_ns, lab.server_ns
    return "\n".join([
        f"lab {lab.name!r} is up: {c} ({client_ip}) <-veth-> {s} ({server_ip}), "
        f"shaped by profile {profile.name!r} both ways",
        f"  server:     ip netns exec {s} edgespec server ...   (listen on {server_ip} or 0.0.0.0)",
        f"  client:     ip netns exec {c} edgespec client ...   (server at {server_ip}:<port>)",
        f"  check it:   ip netns exec {s} edgespec netem echo --listen {server_ip}:9009 &",
        f"              ip netns exec {c} edgespec netem measure {profile.name} --target {server_ip}:9009",
        f"  tear down:  edgespec netem lab down --name {lab.name}",
    ])


@dataclass(frozen=True)
class NetemProbe:
    available: bool | None  # None: could not tell
    detail: str  # how we know, in words


def probe_netem() -> NetemProbe:
    """Try to add a netem qdisc on the loopback of a scratch network namespace."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return NetemProbe(False, f"{' and '.join(missing)} not found (install iproute2)")
    ns = f"edgespec-probe-{os.getpid()}"
    made = _run(["ip", "netns", "add", ns])
    if made.returncode != 0:
        return _probe_without_netns(made.stderr.strip())
    try:
        tried = _run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
    finally:
        _run(["ip", "netns", "del", ns])
    if tried.returncode == 0:
        return NetemProbe(True, "added a netem qdisc in a scratch network namespace")
    return NetemProbe(False, f"the kernel refused a netem qdisc: {tried.stderr.strip() or tried.stdout.strip()}")


def _probe_without_netns(why: str) -> NetemProbe:
    if os.path.isdir("/sys/module/sch_netem"):
        return NetemProbe(True, "the sch_netem module is loaded (/sys/module/sch_netem)")
    if shutil.which("modprobe"):
        dry = _run(["modprobe", "-n", "sch_netem"])
        if dry.returncode == 0:
            return NetemProbe(True, "`modprobe -n sch_netem` finds the module")
        return NetemProbe(False, f"`modprobe -n sch_netem` cannot find the module: {dry.stderr.strip()}")
    return NetemProbe(None, f"could not make a scratch network namespace to test ({why}); "
                            f"run as root to find out")


def require_netem(profile_name: str) -> None:
    probe = probe_netem()
    if probe.available:
        return
    raise NetemUnavailableError(
        f"cannot shape with tc on this host: {probe.detail.rstrip('.')}. The userspace relay applies the same "
        f"profile to a TCP stream instead: edgespec netem relay {profile_name} "
        f"--listen 127.0.0.1:PORT --upstream SERVER_HOST:SERVER_PORT")


def run_commands(commands: list[list[str]]) -> None:
    for cmd in commands:
        done = _run(cmd)
        if done.returncode != 0:
            raise TcCommandError(f"`{shlex.join(cmd)}` failed (exit {done.returncode}): "
                                 f"{done.stderr.strip() or done.stdout.strip()}")


def lab_exists(lab: LabConfig) -> bool:
    listed = _run(["ip", "netns", "list"]).stdout.split()
    return lab.client_ns in listed or lab.server_ns in listed


def run_ignoring_errors(commands: list[list[str]]) -> None:
    """For tearing down: run every command, whatever the ones before did."""
    for cmd in commands:
        _run(cmd)


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)
