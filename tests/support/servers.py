"""The verification server the tests run: in float32 on the CPU, on loopback ports the OS picks; every other
setting is ServerConfig's default unless a test overrides it. The model is the tiny target's folder in most
tests (any registry name or folder works: the real-model tests pass theirs)."""
from __future__ import annotations

import contextlib
from typing import Iterator


def tiny_server_config(model, **overrides):
    """A ServerConfig of `model` (the tiny target's folder, usually); `overrides`: any other ServerConfig fields."""
    from edgespec.server.app import ServerConfig

    return ServerConfig(**{"model": str(model), "dtype": "float32", "device": "cpu", **overrides})


@contextlib.contextmanager
def running_server(model, **overrides) -> Iterator:
    """A started server (ServerHandle) for the with-block; stopped after it with a short grace, so a stream a
    test left open does not hold the teardown."""
    from edgespec.server.app import start_server

    handle = start_server(tiny_server_config(model, **overrides))
    try:
        yield handle
    finally:
        handle.stop(grace=1.0)
