"""A server started elsewhere: what `edgespec bench link|disconnect|specbench --server HOST:PORT` measure.

The benchmark's clients run on this machine and reach the server over the real network, shaped (or not) as
`edgespec netem apply` left it; the plain API baseline is the same server's HTTP side. Every record says
which network that was: the profile tc shows on the route to the server (`netem/link_readout.py`).

A relay with the `ideal` profile (no delay, rate or loss; about 0.3 ms a round trip on loopback) stands on
this machine in front of each of the server's ports, as in a local run: it counts the bytes each system sends
and receives, and `disconnect` cuts the link there, on the client's side, as a laptop losing its network
would.
"""
from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass

from edgespec.shared.defaults import HTTP_PORT
from edgespec.netem.link_readout import LinkReadout, read_link

RELAY_PROFILE = "ideal"  # the local relay in front of a remote server: counts bytes, cuts; shapes nothing


class RemoteServerError(RuntimeError):
    """The server named by --server does not answer."""


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--server takes HOST:PORT (the server's gRPC port), got {address!r}")
    return host.strip("[]"), int(port)


@dataclass
class RemoteServer:
    """A running `edgespec server` this run did not start; a context manager like ServerProcess (a no-op)."""

    grpc_address: str  # HOST:PORT of its gRPC Verifier
    http_address: str  # HOST:PORT of its HTTP side (the plain API)
    model: str = ""  # the target it serves (its /health says)
    link: LinkReadout = LinkReadout("unknown", "", ())  # how the route to it is shaped

    @classmethod
    def connect(cls, grpc_address: str, http_address: str = "", timeout_s: float = 10.0) -> "RemoteServer":
        """Check that the server answers on its HTTP side, and read back how the route to it is shaped."""
        host, _ = split_address(grpc_address)
        http_address = http_address or f"{host}:{HTTP_PORT}"
        split_address(http_address)
        try:
            with urllib.request.urlopen(f"http://{http_address}/health", timeout=timeout_s) as resp:
                model = json.load(resp).get("model", "")
        except OSError as e:  # refused, timed out, or 503 while it loads or drains
            raise RemoteServerError(f"no edgespec server ready at http://{http_address}/health ({e}); start "
                                    f"it there with `edgespec server --host 0.0.0.0`, or name its HTTP side with "
                                    f"--server-http HOST:PORT") from None
        return cls(grpc_address, http_address, model, read_link(host))

    def to_dict(self) -> dict:
        """For every record's environment."""
        return {"grpc": self.grpc_address, "http": self.http_address, "model": self.model,
                "link": self.link.to_dict(), "relay": RELAY_PROFILE}

    def __enter__(self) -> "RemoteServer":
        return self

    def __exit__(self, *exc) -> None:
        return None
