"""The verification server the tests run: the tiny target in float32 on the CPU, on loopback ports the OS
picks; every other setting is ServerConfig's default unless a test overrides it."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest


def tiny_server_config(model_dir, **overrides):
    """A ServerConfig of the tiny target in `model_dir`; `overrides`: any other ServerConfig fields."""
    from edgespec.server.app import ServerConfig

    return ServerConfig(**{"model": str(model_dir), "dtype": "float32", "device": "cpu", **overrides})


@contextlib.contextmanager
def running_server(model_dir, **overrides) -> Iterator:
    """A started server (ServerHandle) for the with-block; stopped after it with a short grace, so a stream a
    test left open does not hold the teardown."""
    from edgespec.server.app import start_server

    handle = start_server(tiny_server_config(model_dir, **overrides))
    try:
        yield handle
    finally:
        handle.stop(grace=1.0)


@pytest.fixture
def start_tiny_server(tiny_model_dir):
    """start_tiny_server(**overrides) -> a running server of the tiny target, stopped after the test."""
    with contextlib.ExitStack() as running:
        yield lambda **overrides: running.enter_context(running_server(tiny_model_dir, **overrides))
