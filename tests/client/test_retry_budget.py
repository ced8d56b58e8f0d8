"""A client facing a server that fails: it ends, with a clear error and the text it has.

- A server error (INTERNAL, a refusal) fails the request at once with the server's message and the output
  so far; the client does not go offline and retry it.
- UNAVAILABLE on every call (a proxy with no healthy upstream, a draining server) is the link: the client
  retries with a growing backoff and ends once ``offline_wait_s`` has passed without a verified answer.

The failing server is a real gRPC server on a real socket, in front of the real edgespec server: it relays
the first messages of a generation, then fails every Session call (a peer behaving badly). The other tests
use the real edgespec server alone.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent import futures

import grpc
import pytest

from edgespec.client.link.grpc_transport import LinkDownError, ServerRefusedError, SessionLostError, classify_rpc_error
from edgespec.shared.wire import ResumePolicy
from edgespec.client.loop.generation import GenerationConfig, GenerationFailedError, LinkEvent, TokenEvent
from edgespec.shared.wire import SERVER_STATUS_METADATA_KEY
from edgespec.proto.edgespec.v1 import pb_grpc
from support.servers import running_server

PROMPT = "def add(a, b):\n    return a + b\n"
OFFLINE_WAIT_S = 2.0
BACKOFF = dict(backoff_initial_s=0.1, backoff_max_s=1.0)
SLACK_S = 3.0  # a busy 2-core machine; the bound is about seconds, the old client never ended


class FailingPeer(pb_grpc.VerifierServicer):
    """Relays Info and the first `good` Session messages to the real server, then aborts every Session call
    with `code` and `details`: marked as the edgespec server marks its own statuses, or unmarked, as a proxy
    or the transport ends a call."""

    def __init__(self, upstream: str, good: int, code: grpc.StatusCode, details: str, marked: bool = True):
        self._upstream = pb_grpc.VerifierStub(grpc.insecure_channel(upstream))
        self._good, self.code, self.details, self.marked = good, code, details, marked
        self._lock = threading.Lock()
        self.streams = 0  # Session calls seen
        self.failures: list[float] = []  # perf_counter times of the aborted calls

    def Info(self, request, context):
        return self._upstream.Info(request, timeout=10)

    def Session(self, request_iterator, context):
        with self._lock:
            self.streams += 1
        metadata = [(k, v) for k, v in context.invocation_metadata() if k == "x-edgespec-session"]
        requests: queue.Queue = queue.Queue()
        replies = None
        try:
            for message in request_iterator:
                with self._lock:
                    self._good -= 1
                    relay = self._good >= 0
                    if not relay:
                        self.failures.append(time.perf_counter())
                if not relay:
                    if self.marked:
                        context.set_trailing_metadata(((SERVER_STATUS_METADATA_KEY, self.code.name),))
                    context.abort(self.code, self.details)
                if replies is None:
                    replies = self._upstream.Session(iter(requests.get, None), metadata=metadata)
                requests.put(message)
                yield next(replies)
        finally:
            requests.put(None)


@pytest.fixture
def failing_peer(tiny_server):
    """failing_peer(good, code, details) -> (address, peer): a real gRPC server on loopback."""
    servers = []

    def start(good: int, code: grpc.StatusCode, details: str, marked: bool = True):
        peer = FailingPeer(tiny_server.address, good, code, details, marked)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pb_grpc.add_VerifierServicer_to_server(peer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", peer

    yield start
    for server in servers:
        server.stop(0)


def bounded(fn, limit_s: float):
    """fn() on a thread; fails the test if it is still running after limit_s (the old client never ended)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"the generation was still running after {limit_s:.0f}s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def run_events(client, ids, config) -> tuple[list, object, float]:
    """(events, result, perf_counter time it ended)."""
    gen = client.generation(ids, config)
    events = list(gen)
    return events, gen.result, time.perf_counter()


# ------------------------------------------------------------- server errors
def test_internal_mid_generation_fails_the_request_with_the_text_so_far(failing_peer, make_client,
                                                                        tiny_target_f32, greedy):
    address, peer = failing_peer(4, grpc.StatusCode.INTERNAL, "internal server error (IndexError: boom)")
    client = make_client(address, "ngram", **BACKOFF)
    ids = client.encode(PROMPT)
    config = GenerationConfig(max_new_tokens=60, ignore_eos=True, offline_wait_s=OFFLINE_WAIT_S)
    with pytest.raises(GenerationFailedError) as info:
        bounded(lambda: client.generate(ids, config), OFFLINE_WAIT_S + SLACK_S)
    err = info.value
    assert err.grpc_code == "INTERNAL" and "IndexError: boom" in str(err)
    got = err.result.token_ids
    assert len(got) >= 4 and got == greedy(tiny_target_f32, ids, len(got), set())  # nothing lost
    assert err.text == client.decode(got) and err.result.finish_reason == "error"
    assert err.result.provisional == 0 and f"after {len(got)} tokens" in str(err)
    assert peer.streams == 1 and len(peer.failures) == 1  # no offline loop: the error was not retried


def test_an_unmarked_internal_is_a_proxy_reset_and_means_the_link(failing_peer, make_client, tiny_target_f32,
                                                                   greedy):
    """What a proxy sends when the replica behind it dies mid-stream: retried as the link, within the budget."""
    address, peer = failing_peer(4, grpc.StatusCode.INTERNAL, "Stream removed", marked=False)
    client = make_client(address, "ngram", **BACKOFF)
    ids = client.encode(PROMPT)
    config = GenerationConfig(max_new_tokens=60, ignore_eos=True, offline_wait_s=OFFLINE_WAIT_S)
    events, r, _ = bounded(lambda: run_events(client, ids, config), OFFLINE_WAIT_S + SLACK_S + 5)
    assert r.finish_reason == "link_lost" and "Stream removed" in r.detail
    assert peer.streams > 1  # reconnected and resumed, not failed at once
    assert r.token_ids == greedy(tiny_target_f32, ids, len(r.token_ids), set()) and len(r.token_ids) >= 4


def test_a_real_server_refusal_mid_generation_fails_with_the_text_so_far(tiny_model_dir, make_client,
                                                                         tiny_target_f32, greedy):
    """The real server refuses a Draft past its context limit: INVALID_ARGUMENT, the text so far kept."""
    with running_server(tiny_model_dir, http_port=None, max_context_tokens=40) as handle:
        client = make_client(handle.address, "ngram", **BACKOFF)
        ids = client.encode("abc abc abc")
        with pytest.raises(GenerationFailedError) as info:
            bounded(lambda: client.generate(ids, GenerationConfig(max_new_tokens=60, ignore_eos=True)), 30)
    err = info.value
    assert err.grpc_code == "INVALID_ARGUMENT" and "max_context_tokens" in str(err)
    got = err.result.token_ids
    assert len(ids) + len(got) <= 40 and len(got) >= 5
    assert got == greedy(tiny_target_f32, ids, len(got), set())
    assert err.text == client.decode(got)


# ------------------------------------------------------------------ the link
def test_unavailable_on_every_call_ends_within_offline_wait(failing_peer, make_client, tiny_target_f32, greedy):
    address, peer = failing_peer(4, grpc.StatusCode.UNAVAILABLE, "no healthy upstream")
    client = make_client(address, "ngram", **BACKOFF)
    ids = client.encode(PROMPT)
    config = GenerationConfig(max_new_tokens=60, ignore_eos=True, offline_wait_s=OFFLINE_WAIT_S)
    events, result, ended = bounded(lambda: run_events(client, ids, config), 3 * OFFLINE_WAIT_S + SLACK_S)
    took = ended - peer.failures[0]
    print(f"failing server: ended {took:.2f}s after the first failure, {len(peer.failures)} failed calls")
    assert took < OFFLINE_WAIT_S + BACKOFF["backoff_max_s"] + SLACK_S
    assert result.finish_reason == "link_lost"
    assert "no healthy upstream" in result.detail and f"within {OFFLINE_WAIT_S:g}s" in result.detail
    assert result.token_ids == greedy(tiny_target_f32, ids, len(result.token_ids), set())
    assert len(result.token_ids) >= 4 and result.provisional == 0
    # Retried, at a falling rate: about log2(offline_wait / backoff_initial) tries, not 5 a second for ever.
    gaps = [b - a for a, b in zip(peer.failures, peer.failures[1:])]
    assert 2 <= len(peer.failures) <= 10, gaps
    assert gaps[-1] > gaps[0], gaps
    assert sum(isinstance(e, LinkEvent) and not e.online for e in events) == 1  # one outage, announced once


def test_an_offline_drafter_finishes_offline_then_ends_with_its_text_unverified(failing_peer, make_client,
                                                                                 tiny_target_f32, greedy):
    address, peer = failing_peer(3, grpc.StatusCode.UNAVAILABLE, "no healthy upstream")
    client = make_client(address, "independent", **BACKOFF)
    ids = client.encode(PROMPT)
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True, offline_wait_s=OFFLINE_WAIT_S,
                              resume_policy=ResumePolicy.ROLLBACK)
    events, result, ended = bounded(lambda: run_events(client, ids, config), 3 * OFFLINE_WAIT_S + SLACK_S)
    assert ended - peer.failures[0] < OFFLINE_WAIT_S + BACKOFF["backoff_max_s"] + SLACK_S
    assert len(result.token_ids) == 30 and result.provisional > 0
    assert "stay unverified" in result.detail and "no healthy upstream" in result.detail
    verified = len(result.token_ids) - result.provisional
    assert result.token_ids[:verified] == greedy(tiny_target_f32, ids, verified, set())
    assert len(peer.failures) <= 10


def test_a_draining_real_server_ends_the_client_within_offline_wait(tiny_model_dir, make_client, tiny_target_f32,
                                                                    greedy):
    """The server drops the session and drains (UNAVAILABLE to every Resume) but never goes away."""
    with running_server(tiny_model_dir, http_port=None) as handle:
        client = make_client(handle.address, "ngram", **BACKOFF)
        ids = client.encode(PROMPT)
        gen = client.generation(ids, GenerationConfig(max_new_tokens=60, ignore_eos=True,
                                                      offline_wait_s=OFFLINE_WAIT_S))
        cut_at: list[float] = []

        def run():
            for e in gen:
                if isinstance(e, TokenEvent) and e.index == 5 and not cut_at:
                    handle.core.draining.set()
                    handle.core.close(gen.session_id)
                    cut_at.append(time.perf_counter())
            return time.perf_counter()

        ended = bounded(run, 3 * OFFLINE_WAIT_S + SLACK_S)
    r = gen.result
    assert ended - cut_at[0] < OFFLINE_WAIT_S + BACKOFF["backoff_max_s"] + SLACK_S
    assert r.finish_reason == "link_lost" and "shutting down" in r.detail
    assert r.token_ids == greedy(tiny_target_f32, ids, len(r.token_ids), set()) and len(r.token_ids) >= 6


@pytest.mark.parametrize("code, marked, kind", [
    (grpc.StatusCode.UNAVAILABLE, True, LinkDownError), (grpc.StatusCode.DEADLINE_EXCEEDED, True, LinkDownError),
    (grpc.StatusCode.CANCELLED, True, LinkDownError), (grpc.StatusCode.NOT_FOUND, True, SessionLostError),
    (grpc.StatusCode.INTERNAL, True, ServerRefusedError), (grpc.StatusCode.UNKNOWN, True, ServerRefusedError),
    (grpc.StatusCode.INVALID_ARGUMENT, True, ServerRefusedError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, True, ServerRefusedError),
    # unmarked: a proxy's reset (nginx sends RST_STREAM INTERNAL_ERROR when the replica dies) is the link
    (grpc.StatusCode.INTERNAL, False, LinkDownError), (grpc.StatusCode.UNKNOWN, False, LinkDownError),
    (grpc.StatusCode.INVALID_ARGUMENT, False, ServerRefusedError),
])
def test_only_transport_codes_mean_the_link(code, marked, kind):
    class Failure(grpc.RpcError):
        def code(self):
            return code

        def details(self):
            return "what the server said"

        def trailing_metadata(self):
            return ((SERVER_STATUS_METADATA_KEY, code.name),) if marked else ()

    err = classify_rpc_error(Failure())
    assert type(err) is kind and "what the server said" in str(err)
