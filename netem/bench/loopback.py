"""Servers and links on this machine: the verification server in this process for the micro-benchmarks,
the link their clients reach it by, and a relay in front of an address for the experiments."""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def loopback_server(model: str, **settings) -> Iterator:
    """A verification server in this process on loopback (gRPC only, on the CPU), stopped on exit;
    `settings` are further ServerConfig fields."""
    from edgespec.server import ServerConfig, start_server

    handle = start_server(ServerConfig(model=model, http_port=None, device="cpu", **settings))
    try:
        yield handle
    finally:
        handle.stop(grace=1.0)


def patient_link(address: str):
    """The link of a benchmark's clients: deadlines long enough that a busy CPU does not look like a dead link."""
    from edgespec.client import LinkConfig

    return LinkConfig(address, max_deadline_s=600, min_deadline_s=60)


@contextlib.contextmanager
def relayed(address: str, profile_name: str | None, seed: int = 0) -> Iterator[tuple[str, object | None]]:
    """Yield (address to connect to, relay or None). No profile = direct connection."""
    if profile_name is None:
        yield address, None
        return
    from edgespec.netem.cli import host_port
    from edgespec.netem.profile import load_profile
    from edgespec.netem.relay_thread import RelayThread

    with RelayThread(load_profile(profile_name), upstream=host_port(address), seed=seed) as relay:
        yield relay.target, relay
