"""Admission: Session streams that send nothing cannot starve the server.

A silent stream is closed once ``first_message_timeout_s`` passes without a first message, and while it
is open it holds no worker: Info, /health and real sessions go on beside 64 of them.
"""
from __future__ import annotations

import queue
import time

import grpc
import httpx
import pytest

from edgespec.proto.edgespec.v1 import pb, pb_grpc
from edgespec.shared.tree import DraftTree, encode_tree
from support.servers import running_server

pytestmark = pytest.mark.slow  # waits out the first-message timeout beside 64 silent streams

SILENT = 64
FIRST_MESSAGE_TIMEOUT_S = 3.0


class SilentStream:
    """A Session stream that is opened and then says nothing (its request iterator never yields)."""

    def __init__(self, stub: pb_grpc.VerifierStub):
        self._requests: queue.Queue = queue.Queue()
        self.call = stub.Session(iter(self._requests.get, None))

    def ending(self) -> grpc.RpcError | None:
        """Block until the server ends the stream; its error (None if it ended without one)."""
        try:
            next(self.call)
        except grpc.RpcError as err:
            return err
        return None

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


@pytest.fixture(scope="module")
def small_server(tiny_model_dir):
    """No API key and room for 8 sessions: before admission, 16 silent streams took every worker."""
    with running_server(tiny_model_dir, max_sessions=8, first_message_timeout_s=FIRST_MESSAGE_TIMEOUT_S) as handle:
        yield handle


def test_silent_streams_delay_neither_info_nor_health_nor_a_real_session(small_server, fingerprint,
                                                                        greedy_reference):
    channel = grpc.insecure_channel(small_server.address)
    stub = pb_grpc.VerifierStub(channel)
    silent = [SilentStream(stub) for _ in range(SILENT)]
    try:
        # The same connection carries the streams first, so the server has all of them when Info comes.
        t0 = time.perf_counter()
        info = stub.Info(pb.InfoRequest(), timeout=FIRST_MESSAGE_TIMEOUT_S / 2)
        info_s = time.perf_counter() - t0
        assert info.tokenizer_fingerprint == fingerprint
        t0 = time.perf_counter()
        health = httpx.get(f"{small_server.http_url}/health", timeout=FIRST_MESSAGE_TIMEOUT_S / 2)
        health_s = time.perf_counter() - t0
        assert health.status_code == 200 and health.json()["status"] == "ok"
        print(f"with {SILENT} silent streams: Info {info_s * 1000:.1f} ms, /health {health_s * 1000:.1f} ms")

        # A real session opened beside them runs to the end, token-exact.
        prompt = [5, 6, 7]
        truth = greedy_reference(prompt, 9)
        requests: queue.Queue = queue.Queue()
        replies = stub.Session(iter(requests.get, None), timeout=FIRST_MESSAGE_TIMEOUT_S / 2)
        requests.put(pb.ClientMessage(open=pb.Open(session_id="beside", prompt_ids=prompt,
                                                   tokenizer_fingerprint=fingerprint)))
        committed = prompt + [next(replies).opened.first_token]
        for step in range(1, 3):
            chain = truth[len(committed) - len(prompt): len(committed) - len(prompt) + 3]
            requests.put(pb.ClientMessage(draft=pb.Draft(session_id="beside", step=step,
                                                         committed_len=len(committed),
                                                         tree=encode_tree(DraftTree.chain(chain)))))
            v = next(replies).verified
            assert list(v.accepted) == [0, 1, 2]
            committed += chain + [v.bonus_token]
        requests.put(pb.ClientMessage(close=pb.Close(session_id="beside")))
        assert next(replies).HasField("closed")
        requests.put(None)
        assert committed[len(prompt):] == truth

        # The silent streams are closed with a status and a message that say what the server wanted.
        for stream in silent:
            err = stream.ending()
            assert err is not None and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err
            assert "first message" in err.details() and "Open" in err.details()
    finally:
        for stream in silent:
            stream.close()
        channel.close()


def test_a_stream_that_opens_at_once_is_not_cut_by_admission(small_server, fingerprint):
    """The timeout is for the first message only: a session idle after its Open keeps its stream."""
    channel = grpc.insecure_channel(small_server.address)
    requests: queue.Queue = queue.Queue()
    replies = pb_grpc.VerifierStub(channel).Session(iter(requests.get, None))
    requests.put(pb.ClientMessage(open=pb.Open(session_id="slow", prompt_ids=[1, 2],
                                               tokenizer_fingerprint=fingerprint)))
    opened = next(replies).opened
    time.sleep(FIRST_MESSAGE_TIMEOUT_S + 1)
    requests.put(pb.ClientMessage(draft=pb.Draft(session_id="slow", step=1, committed_len=3,
                                                 tree=encode_tree(DraftTree.chain([opened.first_token])))))
    assert next(replies).verified.committed_len >= 4
    requests.put(None)
    channel.close()
