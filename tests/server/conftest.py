"""Server test fixtures: a tiny-model server on loopback, Session streams to it (the client's own stream:
tests/support/streams.py), greedy references."""
from __future__ import annotations

from typing import Callable

import grpc
import pytest
from support.greedy import recomputed_greedy
from support.servers import running_server
from support.streams import ServerStream

from edgespec.proto.edgespec.v1 import pb_grpc


@pytest.fixture(scope="session")
def tiny_target(tiny_model_dir):
    """The tiny target as the server loads it (float32 on CPU), for references in the test process."""
    from edgespec.server.target import TargetModel
    from edgespec.shared.models.loading import load_model

    return TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32"))


@pytest.fixture(scope="session")
def greedy_reference(tiny_target) -> Callable[[list[int], int], list[int]]:
    """ids, n -> the target's own greedy continuation of n tokens (full recompute each step, no cache)."""
    return lambda ids, n: recomputed_greedy(tiny_target.model, ids, n)


@pytest.fixture(scope="module", params=["generic", "batched"])
def scheduler(request, target):
    """Both engines over the module's own `target` fixture (a module without one defines its own scheduler)."""
    from edgespec.server.engine.batched import BatchedEngine, PoolConfig
    from edgespec.server.engine.generic import GenericEngine
    from edgespec.server.scheduler import ModelScheduler

    engine = (GenericEngine(target) if request.param == "generic" else
              BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=4, max_context_tokens=1024)))
    s = ModelScheduler(engine)
    yield s
    s.close()


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    """A server on loopback with the tiny target, a random MoA server part, and small caps."""
    with running_server(tiny_model_dir, max_sessions=64, random_moa_parts=("random",),
                        max_context_tokens=512) as handle:
        yield handle


@pytest.fixture
def channel(tiny_server):
    with grpc.insecure_channel(tiny_server.address) as ch:
        yield ch


@pytest.fixture
def stub(channel):
    return pb_grpc.VerifierStub(channel)


@pytest.fixture
def fingerprint(tiny_target) -> str:
    return tiny_target.fingerprint


@pytest.fixture
def open_stream(channel):
    """open_stream(session_id=None, api_key=None, on=None) -> a ServerStream on the tiny server (or on the
    channel `on`); session_id and api_key go into the call metadata as a client sends them."""
    streams: list[ServerStream] = []

    def make(session_id: str | None = None, api_key: str | None = None,
             on: grpc.Channel | None = None) -> ServerStream:
        streams.append(ServerStream(on or channel, session_id, api_key))
        return streams[-1]

    yield make
    for s in streams:
        s.close()
