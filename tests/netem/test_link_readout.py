"""Reading back how the route to a host is shaped: tc's qdisc lines named as the profile `netem apply` installed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from edgespec.netem.link_readout import netem_values, profile_of, read_link
from edgespec.netem.profile import load_profile
from edgespec.netem.tc import netem_args


def shown(args: list[str]) -> str:
    """A netem line as `tc qdisc show` prints what `edgespec netem apply` installed (its units and spacing)."""
    text = " ".join(args).replace("distribution normal", "").replace("mbit", "Mbit").replace("kbit", "Kbit")
    return f"qdisc netem 8001: root refcnt 2 limit 1000 {text}"


@pytest.mark.parametrize("name", ["4g", "3g", "5g", "wifi"])
@pytest.mark.parametrize("direction", ["up", "down"])
def test_each_profile_reads_back_as_itself(name, direction):
    line = shown(netem_args(load_profile(name).direction(direction)))
    assert profile_of(line) == name


def test_netem_values_and_what_is_no_profile():
    v = netem_values("qdisc netem 8001: root refcnt 2 limit 1000 delay 75ms  25ms loss 0.5% rate 750Kbit")
    assert v == {"delay_ms": 75.0, "jitter_ms": 25.0, "loss_percent": 0.5, "rate_mbit": 0.75}
    assert netem_values("qdisc tbf 8001: root refcnt 2 rate 20Mbit burst 4Kb lat 50ms") is None
    assert profile_of("qdisc netem 8001: root refcnt 2 limit 1000 delay 33ms") is None


def test_loopback_unshaped_reads_none():
    if not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("needs iproute2")
    link = read_link("127.0.0.1")
    assert link.device == "lo"
    if not subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout.count("noqueue"):
        pytest.skip("this host shapes its loopback")
    assert link.profile == "none" and link.qdiscs == ()


def test_a_rate_limit_in_a_namespace_reads_back_from_the_kernel():
    """A tbf on a network namespace's loopback (netem may be missing from the kernel; tbf rarely is): the readout
    run inside the namespace names it."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2")
    ns = f"es-readout-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
        pytest.skip("cannot make a network namespace here")
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        added = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "20mbit",
                                "burst", "32kbit", "latency", "50ms"], capture_output=True, text=True)
        if added.returncode != 0:
            pytest.skip(f"no tbf here: {added.stderr.strip()}")
        code = "from edgespec.netem.link_readout import read_link; r = read_link('127.0.0.1'); print(r.profile)"
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out.startswith("tc:qdisc tbf") and "rate 20Mbit" in out
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
