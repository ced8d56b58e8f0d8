"""Resume has a deadline of its own, below the offline wait: a server that takes the stream and never answers
cannot hold the client past it (Open's deadline, minutes for a long prefill, is not Resume's)."""
from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from edgespec.client.link.grpc_transport import GrpcTransport, Link, LinkConfig, LinkDownError
from edgespec.client.loop.generation import GenerationConfig
from edgespec.proto.edgespec.v1 import pb


def test_the_default_resume_deadline_is_below_the_offline_wait():
    config = LinkConfig("h:1")
    assert config.resume_timeout_s < GenerationConfig().offline_wait_s < config.open_timeout_s
    with pytest.raises(ValueError, match="resume_timeout_s"):
        LinkConfig("h:1", resume_timeout_s=0)


@pytest.fixture
def silent_server():
    """A real gRPC server whose Session reads every message and never answers."""
    release = threading.Event()

    def session(requests, context):
        for _ in requests:
            release.wait(60)
        return iter(())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler("edgespec.v1.Verifier", {
        "Session": grpc.stream_stream_rpc_method_handler(session, request_deserializer=pb.ClientMessage.FromString,
                                                         response_serializer=pb.ServerMessage.SerializeToString)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    release.set()
    server.stop(0)


def test_a_resume_the_server_never_answers_fails_within_its_own_deadline(silent_server):
    link = Link(LinkConfig(silent_server, resume_timeout_s=0.5, open_timeout_s=300))
    transport = GrpcTransport(link)
    transport.start("s")
    t0 = time.monotonic()
    with pytest.raises(LinkDownError, match="DEADLINE_EXCEEDED|deadline|no answer"):
        transport.request(pb.ClientMessage(resume=pb.Resume(session_id="s", committed_len=3)))
    assert time.monotonic() - t0 < 30  # Open's 300 s deadline would still be running
    transport.close()
    link.close()
