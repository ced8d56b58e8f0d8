"""tc/netem commands: exact `--dry-run` output, and an honest answer where netem is missing."""
from __future__ import annotations

import subprocess

import pytest

from edgespec.netem.profile import parse_profile
from edgespec.netem.tc import LabConfig, lab_up_commands, netem_args, probe_netem
from edgespec.cli import main

FOUR_G_NETEM = "netem delay 21ms 19ms distribution normal loss 0.1% rate 20mbit"


def test_apply_dry_run_is_exactly_the_tc_line(capsys):
    assert main(["netem", "apply", "4g", "--dev", "eth0", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"tc qdisc replace dev eth0 root {FOUR_G_NETEM}"]


def test_lab_up_dry_run_is_exactly_the_ip_and_tc_lines(capsys):
    assert main(["netem", "lab", "up", "4g", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ip netns add es-client",
        "ip netns add es-server",
        "ip link add es-c type veth peer name es-s",
        "ip link set es-c netns es-client",
        "ip link set es-s netns es-server",
        "ip -n es-client addr add 10.77.0.1/24 dev es-c",
        "ip -n es-server addr add 10.77.0.2/24 dev es-s",
        "ip -n es-client link set lo up",
        "ip -n es-server link set lo up",
        "ip -n es-client link set es-c up",
        "ip -n es-server link set es-s up",
        f"tc -n es-client qdisc replace dev es-c root {FOUR_G_NETEM}",
        f"tc -n es-server qdisc replace dev es-s root {FOUR_G_NETEM}",
    ]


def test_lab_down_and_clear_dry_run(capsys):
    assert main(["netem", "lab", "down", "--name", "x", "--dry-run"]) == 0
    assert main(["netem", "clear", "--dev", "eth0", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ip netns del x-client", "ip netns del x-server", "tc qdisc del dev eth0 root"]


def test_netem_args_per_distribution_and_direction():
    p = parse_profile({"both": {"delay": {"distribution": "uniform", "mean_ms": 30, "deviation_ms": 5}},
                       "up": {"rate_mbit": 0.75}, "down": {"delay": {"distribution": "pareto"}}})
    assert netem_args(p.up) == ["delay", "30ms", "5ms", "rate", "750kbit"]  # netem jitter is uniform
    assert netem_args(p.down) == ["delay", "30ms", "5ms", "distribution", "pareto"]
    assert netem_args(parse_profile({"both": {}}).up) == []
    cmds = lab_up_commands(p, LabConfig("lab2", "192.168.50.0/24"))
    assert cmds[5] == ["ip", "-n", "lab2-client", "addr", "add", "192.168.50.1/24", "dev", "lab2-c"]
    assert cmds[-2][-6:] == ["netem", "delay", "30ms", "5ms", "rate", "750kbit"]


def test_without_netem_apply_refuses_and_points_at_the_relay(capsys):
    probe = probe_netem()
    assert "edgespec-probe" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                  text=True).stdout
    if probe.available is not False:
        pytest.skip(f"this host has netem (or cannot tell: {probe.detail}); not shaping it in a test")
    assert main(["netem", "apply", "4g", "--dev", "lo"]) == 1
    assert main(["netem", "lab", "up", "4g", "--name", "estest"]) == 1
    err = capsys.readouterr().err
    assert "cannot shape with tc on this host" in err and "edgespec netem relay 4g" in err
    assert "estest" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                          text=True).stdout
    assert main(["netem", "check"]) == 1
    assert "NOT available" in capsys.readouterr().out


def test_lab_instructions_say_how_to_run_each_side():
    from edgespec.netem.profile import load_profile
    from edgespec.netem.tc import lab_instructions, notes_for

    text = lab_instructions(load_profile("4g"))
    assert "ip netns exec es-server edgespec server" in text
    assert "ip netns exec es-client edgespec client" in text
    assert "edgespec netem measure 4g --target 10.77.0.2:9009" in text
    assert notes_for(load_profile("4g")) == []
    assert any("relay only" in n for n in notes_for(load_profile("4g-trace")))


def test_lab_ip_commands_really_build_a_working_lab():
    """The lab's ip lines (everything but netem's tc lines) run here: root and netns are enough."""
    import os
    import sys

    from edgespec.netem.profile import load_profile
    from edgespec.netem.tc import lab_down_commands, lab_exists, run_commands

    lab = LabConfig(f"est{os.getpid() % 10000}", "10.199.7.0/24")
    ip_lines = [c for c in lab_up_commands(load_profile("4g"), lab) if c[0] == "ip"]
    try:
        run_commands(ip_lines[:1])
    except Exception as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        run_commands(ip_lines[1:])
        # a TCP connect from the client side to a closed port on the server side is refused
        # (not timed out) only if the veth pair, addresses and links are right
        probe = ("import socket\ntry:\n    socket.create_connection(('10.199.7.2', 9), timeout=3)\n"
                 "except ConnectionRefusedError:\n    print('refused')\n")
        done = subprocess.run(["ip", "netns", "exec", lab.client_ns, sys.executable, "-c", probe],
                              capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() == "refused", done.stderr
    finally:
        run_commands(lab_down_commands(lab))
    assert not lab_exists(lab)
