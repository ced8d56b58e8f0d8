"""A real gRPC server and client (the edgespec.v1 stubs) talking through the relay while
the link is cut and restored. The servicer is this test's own: Open gets a fixed Opened,
each Draft a Verified with the same step."""
from __future__ import annotations

import queue
import threading
import time
from concurrent import futures

import grpc
import pytest

from edgespec.netem.profile import load_profile
from edgespec.netem.relay_thread import RelayThread
from edgespec.proto.edgespec.v1 import pb, pb_grpc

SERVER_OPTIONS = [  # let clients ping every 100 ms without calls (the default allows one per 5 min)
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 50),
    ("grpc.http2.max_ping_strikes", 0),
]


def channel_options(keepalive_timeout_ms: int) -> list[tuple[str, int]]:
    # grpcio 1.85 waits for a ping ack for `grpc.http2.ping_timeout_ms` (default about a
    # minute); keepalive_timeout_ms alone does not shorten it.
    return [
        ("grpc.keepalive_time_ms", 200),
        ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
        ("grpc.http2.ping_timeout_ms", keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Retry soon after a reset (initial/max backoff). grpc core uses
        # min_reconnect_backoff_ms as the time it gives one connection attempt (TCP +
        # HTTP/2 SETTINGS), not as a backoff: at 100 ms, a 4g link on a busy host fails
        # with "timed out before receiving SETTINGS frame". Keep it at seconds.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.min_reconnect_backoff_ms", 5000),
    ]


class FixedVerifier(pb_grpc.VerifierServicer):
    def Info(self, request, context):
        return pb.InfoResponse(model_name="fixed-for-netem-tests", vocab_size=320)

    def Session(self, request_iterator, context):
        for msg in request_iterator:
            kind = msg.WhichOneof("kind")
            if kind == "open":
                yield pb.ServerMessage(opened=pb.Opened(
                    session_id=msg.open.session_id, first_token=42,
                    committed_len=len(msg.open.prompt_ids) + 1))
            elif kind == "draft":
                yield pb.ServerMessage(verified=pb.Verified(
                    session_id=msg.draft.session_id, step=msg.draft.step, bonus_token=7,
                    committed_len=msg.draft.committed_len + 1))
            elif kind == "close":
                yield pb.ServerMessage(closed=pb.Closed(session_id=msg.close.session_id))
                return


class StreamCall:
    """One Session stream; responses (or the RpcError that ended it) land in a queue."""

    def __init__(self, stub: pb_grpc.VerifierStub, **kwargs):
        self.requests: queue.Queue = queue.Queue()
        self.responses: queue.Queue = queue.Queue()
        self.call = stub.Session(iter(self.requests.get, None), **kwargs)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for response in self.call:
                self.responses.put(response)
        except grpc.RpcError as exc:
            self.responses.put(exc)

    def send(self, msg: pb.ClientMessage) -> None:
        self.requests.put(msg)

    def recv(self, timeout: float):
        return self.responses.get(timeout=timeout)

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()


def _open(sid="s1"):
    return pb.ClientMessage(open=pb.Open(session_id=sid, prompt_ids=[1, 2, 3], max_new_tokens=16))


def _draft(step, sid="s1"):
    return pb.ClientMessage(draft=pb.Draft(session_id=sid, step=step, committed_len=3 + step,
                                           tree=b"\x05\x00\x00\xff"))


@pytest.fixture
def verifier_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=SERVER_OPTIONS)
    pb_grpc.add_VerifierServicer_to_server(FixedVerifier(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield ("127.0.0.1", port)
    server.stop(grace=None)


def test_blackhole_mid_stream_then_restore_keeps_the_stream(verifier_server):
    with RelayThread(load_profile("4g"), upstream=verifier_server, seed=1) as relay, \
            grpc.insecure_channel(relay.target, options=channel_options(10_000)) as channel:
        stub = pb_grpc.VerifierStub(channel)
        assert stub.Info(pb.InfoRequest(), timeout=20, wait_for_ready=True).model_name == "fixed-for-netem-tests"
        call = StreamCall(stub, wait_for_ready=True)
        call.send(_open())
        assert call.recv(20).opened.committed_len == 4
        for step in (1, 2):
            call.send(_draft(step))
            assert call.recv(10).verified.step == step

        # idle: only keepalive pings cross the link, and they must get through both ways
        before = relay.stats()
        time.sleep(1.5)
        idle = relay.stats()
        assert idle.bytes_up > before.bytes_up and idle.bytes_down > before.bytes_down
        call.send(_draft(3))
        assert call.recv(10).verified.step == 3

        relay.cut("blackhole")
        call.send(_draft(4))
        with pytest.raises(queue.Empty):
            call.recv(1.0)
        relay.restore()
        answer = call.recv(10)
        assert not isinstance(answer, grpc.RpcError), answer
        assert answer.verified.step == 4 and answer.verified.committed_len == 8
        call.close()


def test_blackhole_is_detected_by_keepalive(verifier_server):
    with RelayThread(load_profile("5g"), upstream=verifier_server, seed=2) as relay, \
            grpc.insecure_channel(relay.target, options=channel_options(500)) as channel:
        call = StreamCall(pb_grpc.VerifierStub(channel), wait_for_ready=True)
        call.send(_open())
        assert call.recv(20).opened.first_token == 42
        relay.cut("blackhole")
        t0 = time.monotonic()
        call.send(_draft(1))
        failure = call.recv(15)
        assert isinstance(failure, grpc.RpcError), failure
        assert failure.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - t0 < 10  # keepalive: ~0.2 s + 0.5 s timeout, not hours
        assert relay.stats().connections_open == 1  # the blackhole itself closed nothing
        call.close()


def test_reset_fails_the_stream_at_once_and_the_channel_reconnects(verifier_server):
    with RelayThread(load_profile("4g"), upstream=verifier_server, seed=3) as relay, \
            grpc.insecure_channel(relay.target, options=channel_options(10_000)) as channel:
        stub = pb_grpc.VerifierStub(channel)
        call = StreamCall(stub, wait_for_ready=True)
        call.send(_open())
        assert call.recv(20).opened.committed_len == 4

        t0 = time.monotonic()
        relay.cut("reset")
        failure = call.recv(10)
        assert isinstance(failure, grpc.RpcError), failure
        assert failure.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - t0 < 2
        call.close()

        relay.restore()
        again = StreamCall(stub, wait_for_ready=True, timeout=20)
        again.send(_open("s2"))
        opened = again.recv(20)
        assert not isinstance(opened, grpc.RpcError), opened
        assert opened.opened.session_id == "s2"
        again.send(pb.ClientMessage(close=pb.Close(session_id="s2")))
        assert again.recv(10).closed.session_id == "s2"
        again.close()
        assert relay.stats().connections_reset >= 1
