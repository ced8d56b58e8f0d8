"""Server test fixtures: a tiny-model server on loopback, a session stream helper, greedy references."""
from __future__ import annotations

import queue
from typing import Callable

import grpc
import pytest
import torch

from edgespec.proto.edgespec.v1 import pb, pb_grpc


class SessionStream:
    """One bidirectional Session stream driven message by message: send() returns the server's answer."""

    def __init__(self, stub: pb_grpc.VerifierStub, metadata: tuple = ()):
        self._requests: queue.Queue = queue.Queue()
        self._replies = stub.Session(iter(self._requests.get, None), metadata=metadata)

    def send(self, **kind) -> pb.ServerMessage:
        self._requests.put(pb.ClientMessage(**kind))
        return next(self._replies)

    def close(self) -> None:
        self._requests.put(None)
        self._replies.cancel()

    def __enter__(self) -> "SessionStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@pytest.fixture(scope="session")
def tiny_target(tiny_model_dir):
    """The tiny target as the server loads it (float32 on CPU), for references in the test process."""
    from edgespec.server.target import TargetModel
    from edgespec.shared.models.loading import load_model

    return TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32"))


@pytest.fixture(scope="session")
def greedy_reference(tiny_target) -> Callable[[list[int], int], list[int]]:
    """ids, n -> the target's own greedy continuation of n tokens (full recompute each step, no cache)."""

    @torch.inference_mode()
    def run(ids: list[int], n: int) -> list[int]:
        out = list(ids)
        for _ in range(n):
            logits = tiny_target.model(input_ids=torch.tensor([out])).logits[0, -1]
            out.append(int(logits.argmax()))
        return out[len(ids):]

    return run


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    """A server on loopback with the tiny target, a random MoA server part, and small caps."""
    from edgespec.server.app import ServerConfig, start_server

    config = ServerConfig(model=str(tiny_model_dir), dtype="float32", device="cpu", max_sessions=64,
                          random_moa_parts=("random",), max_context_tokens=512)
    with start_server(config) as handle:
        yield handle


@pytest.fixture
def stub(tiny_server):
    channel = grpc.insecure_channel(tiny_server.address)
    yield pb_grpc.VerifierStub(channel)
    channel.close()


@pytest.fixture
def fingerprint(tiny_target) -> str:
    return tiny_target.fingerprint


@pytest.fixture
def open_stream(stub):
    """Factory: open_stream(metadata=(), stub=None) -> SessionStream on the tiny server (or the given stub)."""
    streams: list[SessionStream] = []

    def make(metadata: tuple = (), on: pb_grpc.VerifierStub | None = None) -> SessionStream:
        streams.append(SessionStream(on or stub, metadata))
        return streams[-1]

    yield make
    for s in streams:
        s.close()
