"""Graceful stop: new sessions are refused while draining, and a verification in flight still gets its answer."""
from __future__ import annotations

import threading
import time

import grpc
import httpx
import pytest

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.tree import ROOT, DraftTree, encode_tree
from support.servers import tiny_server_config


def test_stop_finishes_the_verification_in_flight_and_refuses_new_sessions(tiny_model_dir, fingerprint,
                                                                           open_stream):
    from edgespec.server.app import start_server

    handle = start_server(tiny_server_config(tiny_model_dir))  # the test stops it itself
    channel = grpc.insecure_channel(handle.address)
    stream = open_stream(on=channel)
    stream.send(open=pb.Open(session_id="inflight", prompt_ids=[1, 2, 3], tokenizer_fingerprint=fingerprint))

    # Occupy the model thread so the Draft below is still queued when stop() begins.
    busy = threading.Thread(target=handle.core.scheduler.run, args=(time.sleep, 1.5))
    busy.start()
    time.sleep(0.1)
    answers: list = []
    drafter = threading.Thread(target=lambda: answers.append(stream.send(draft=pb.Draft(
        session_id="inflight", step=1, committed_len=4, tree=encode_tree(DraftTree((5,), (ROOT,)))))))
    drafter.start()
    time.sleep(0.2)
    stopper = threading.Thread(target=handle.stop, kwargs={"grace": 2})
    stopper.start()
    time.sleep(0.2)
    assert handle.core.draining.is_set()
    assert httpx.get(f"{handle.http_url}/health").status_code == 503
    late = open_stream(on=channel)
    with pytest.raises(grpc.RpcError) as info:
        late.send(open=pb.Open(session_id="late", prompt_ids=[1], tokenizer_fingerprint=fingerprint))
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE,)
    drafter.join(10)
    stopper.join(10)
    busy.join()
    assert answers and answers[0].verified.committed_len >= 5
    channel.close()


def test_http_requests_in_flight_get_the_drain_grace_not_a_fixed_five_seconds(tiny_model_dir):
    """A request whose body never ends holds the HTTP side until the grace runs out: --drain-grace (0.5 s here)
    bounds it, as it bounds gRPC calls."""
    import socket

    from edgespec.server.app import start_server

    handle = start_server(tiny_server_config(tiny_model_dir, drain_grace_s=0.5))
    with socket.create_connection(("127.0.0.1", handle.http_port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"prompt\": ")  # the rest never comes
        time.sleep(0.3)  # the request is in flight, waiting for its body
        t0 = time.monotonic()
        handle.stop()  # the config's grace
        took = time.monotonic() - t0
    assert took < 3.0, took  # 0.5 s of grace and the loop's own ticks; it was 5 s + before
