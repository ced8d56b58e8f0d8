"""The client's link to the verification server: channel, session stream, deadlines, reconnects.

A dead link comes in two kinds and both must be found quickly:
- reset: the connection errors at once; the stream's reader sees an RpcError.
- blackhole: packets vanish and the socket stays open; nothing errors. A deadline
  on every Draft (a few times the slowest recent round trip) and keepalive pings
  of a few seconds catch it.
Reconnects use fresh channels (with their own subchannel pool, so a new channel
never reuses the dead connection), with exponential backoff and jitter between
attempts, on a background thread so offline generation goes on meanwhile.
"""
from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import grpc

from edgespec.proto.edgespec.v1 import pb, pb_grpc
from edgespec.shared.errors import EdgespecError
from edgespec.shared.wire import (API_KEY_METADATA_KEY, DEFAULT_MAX_MESSAGE_BYTES, NODE_BYTES,
                                  SERVER_STATUS_METADATA_KEY, SESSION_METADATA_KEY)

from .verifier import LinkDownError, ServerRefusedError, SessionLostError

log = logging.getLogger(__name__)

# Status codes of the transport, or of a server (or proxy) that cannot take the call now: go offline,
# reconnect, resume, within the retry budget. Every other code is the server's answer to the request itself
# (INTERNAL, UNKNOWN: a server-side bug; INVALID_ARGUMENT, ...: a refusal): retrying would get it again, so
# the request fails with the server's message instead of going offline in a loop.
_LINK_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
# Status codes that mean "this session is gone on the server": resume rebuilds it.
_SESSION_CODES = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ABORTED}
# Codes a transport or proxy also produces (an HTTP/2 RST_STREAM, a proxy's upstream reset): the server's own
# only when it says so in SERVER_STATUS_METADATA_KEY.
_TRANSPORT_TOO_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


def classify_rpc_error(err: grpc.RpcError) -> EdgespecError:
    """Map a gRPC failure to what the loop does about it."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    trailing = dict(err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else {}
    return classify_status(code, err.details() if hasattr(err, "details") else str(err),
                           from_server=SERVER_STATUS_METADATA_KEY in trailing)


def classify_status(code: grpc.StatusCode, detail: str, from_server: bool = True) -> EdgespecError:
    """The error a call that ended with this status raises (the in-process transport maps the same way).

    from_server: the status carries the edgespec server's mark; without it INTERNAL and UNKNOWN are
    the transport's or a proxy's, and mean the link.
    """
    if code in _SESSION_CODES:
        return SessionLostError(f"server lost the session ({code.name}): {detail}")
    if code in _LINK_CODES or (code in _TRANSPORT_TOO_CODES and not from_server):
        return LinkDownError(f"link to the server failed ({code.name}): {detail}")
    return ServerRefusedError(f"server refused the request ({code.name}): {detail}", code.name)


@dataclass(frozen=True)
class LinkConfig:
    """How the client reaches the server and decides it is gone."""

    address: str  # the server's gRPC HOST:PORT
    tls: bool = False  # connect with TLS, checking the server's certificate against the CA file, else the system roots
    root_certificates: str | None = None  # PEM file of the CA that signed the server's certificate (with tls)
    api_key: str | None = None  # sent as "authorization: Bearer <key>" on every call
    keepalive_s: float = 2.0  # HTTP/2 ping interval while the channel is up: finds a blackhole when idle
    keepalive_timeout_s: float = 2.0  # a ping unanswered this long closes the connection
    connect_timeout_s: float = 2.0  # one connection attempt's wait for the channel to become ready
    open_timeout_s: float = 300.0  # deadline of Open (prefill of a long prompt on a CPU is slow)
    resume_timeout_s: float = 20.0  # deadline of Resume: below GenerationConfig.offline_wait_s (30 s), so a server
    # that takes the stream and never answers cannot hold the client past its offline wait; a Resume re-prefills
    # only when the server lost the session
    deadline_factor: float = 4.0  # a Draft's deadline is this times the slowest recent round trip, clamped to:
    min_deadline_s: float = 1.0  # floor of a Draft's deadline in seconds (scheduling noise on a busy laptop)
    max_deadline_s: float = 30.0  # ceiling of a Draft's deadline in seconds
    rtt_window: int = 8  # recent Draft round trips the deadline looks at
    backoff_initial_s: float = 0.1  # wait after the first failure (a failed connect, or a call that failed on a
    # fresh connection) before the next try
    backoff_max_s: float = 5.0  # longest wait between tries
    backoff_multiplier: float = 2.0  # growth of the wait per consecutive failure (reset by a verified answer)
    backoff_jitter: float = 0.2  # +- this fraction of randomness, so clients do not retry in lockstep
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # largest message sent or received

    def __post_init__(self) -> None:
        if not self.address or ":" not in self.address:
            raise ValueError(f"server address must be HOST:PORT, got {self.address!r}")
        if self.min_deadline_s <= 0 or self.max_deadline_s < self.min_deadline_s:
            raise ValueError("need 0 < min_deadline_s <= max_deadline_s")
        if self.open_timeout_s <= 0 or self.resume_timeout_s <= 0:
            raise ValueError("open_timeout_s and resume_timeout_s must be above 0 seconds")


def draft_deadline(round_trips: Sequence[float | tuple[int, float]], config: LinkConfig,
                   fallback_s: float | None = None, nodes: int | None = None,
                   latest_by_size: dict[int, float] | None = None) -> float:
    """Seconds to wait for a Verified: factor x the slowest of the recent round trips, clamped.

    round_trips: seconds, or (tree nodes, seconds). With ``nodes`` (this Draft's tree), a recent round trip
    of a smaller tree counts scaled up by how much longer the server took on this size than on that one the
    last time each was sent (``latest_by_size``), or by the node counts where this size was never sent. On a
    slow server a run of plain steps (the tree planner's "none") followed by a full tree (its exploration)
    otherwise looks like a dead link: 4 x a 0.5 s decode step is less than one 16-node verification on a CPU.
    """
    recent = [(None, r) if isinstance(r, (int, float)) else r for r in list(round_trips)[-config.rtt_window:]]
    if recent:
        base = max(seconds * _size_ratio(nodes, n, latest_by_size or {}) for n, seconds in recent)
    else:
        base = fallback_s if fallback_s is not None else config.max_deadline_s / config.deadline_factor
    return min(config.max_deadline_s, max(config.min_deadline_s, config.deadline_factor * base))


def _size_ratio(nodes: int | None, seen_nodes: int | None, latest_by_size: dict[int, float]) -> float:
    """How much longer a Draft of ``nodes`` is expected to take than one of ``seen_nodes`` (at least 1)."""
    if nodes is None or seen_nodes is None or nodes <= seen_nodes:
        return 1.0
    if nodes in latest_by_size and latest_by_size.get(seen_nodes, 0.0) > 0:
        return max(1.0, latest_by_size[nodes] / latest_by_size[seen_nodes])
    return (nodes + 1) / (seen_nodes + 1)  # a verification costs at most linearly in its rows


def backoff_delay(attempt: int, config: LinkConfig, rng: random.Random) -> float:
    """Wait after consecutive failure `attempt` + 1 (attempt 0: the first failure): exponential with jitter."""
    base = min(config.backoff_max_s, config.backoff_initial_s * config.backoff_multiplier ** attempt)
    return max(0.0, base * (1.0 + rng.uniform(-config.backoff_jitter, config.backoff_jitter)))


def make_channel(config: LinkConfig) -> grpc.Channel:
    """A new channel with keepalive and its own connection (never shared with an older channel)."""
    options = [
        ("grpc.keepalive_time_ms", int(config.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.enable_retries", 0),  # the loop decides what a failure means; gRPC must not replay Drafts
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", int(config.backoff_initial_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(config.backoff_max_s * 1000)),
    ]
    if config.tls:
        roots = Path(config.root_certificates).read_bytes() if config.root_certificates else None
        return grpc.secure_channel(config.address, grpc.ssl_channel_credentials(root_certificates=roots), options)
    return grpc.insecure_channel(config.address, options)


def wait_ready(channel: grpc.Channel, timeout_s: float) -> bool:
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False


def call_metadata(config: LinkConfig, session_id: str | None = None) -> list[tuple[str, str]]:
    md = []
    if session_id:
        md.append((SESSION_METADATA_KEY, session_id))
    if config.api_key:
        md.append((API_KEY_METADATA_KEY, f"Bearer {config.api_key}"))
    return md


def connect(config: LinkConfig) -> grpc.Channel:
    """A ready channel, or LinkDownError naming the address."""
    channel = make_channel(config)
    if not wait_ready(channel, config.connect_timeout_s):
        channel.close()
        raise LinkDownError(f"cannot reach the edgespec server at {config.address} (no connection within "
                            f"{config.connect_timeout_s:.1f}s); is `edgespec server` running there?")
    return channel


def server_info(channel: grpc.Channel, config: LinkConfig, timeout_s: float = 10.0) -> pb.InfoResponse:
    try:
        return pb_grpc.VerifierStub(channel).Info(pb.InfoRequest(), timeout=timeout_s,
                                                  metadata=call_metadata(config))
    except grpc.RpcError as err:
        raise classify_rpc_error(err) from None


_END = object()  # the server ended the stream without an error


class SessionStream:
    """One Session stream: send a message, wait (with a deadline) for its one answer."""

    def __init__(self, channel: grpc.Channel, config: LinkConfig, session_id: str):
        self._requests: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()
        self._ended = threading.Event()  # the reader saw the stream end: no answer can come any more
        self._call = pb_grpc.VerifierStub(channel).Session(
            self._outgoing(), metadata=call_metadata(config, session_id))
        self._reader = threading.Thread(target=self._read, name="edgespec-stream-reader", daemon=True)
        self._reader.start()
        self.closed = False

    def _outgoing(self):
        while True:
            msg = self._requests.get()
            if msg is None:
                return
            yield msg

    def _read(self) -> None:
        try:
            for answer in self._call:
                self._answers.put(answer)
            self._answers.put(_END)
        except Exception as err:  # an RpcError, or a broken channel's other error (link loss)
            self._answers.put(err)
        finally:
            self._ended.set()

    def send(self, message: pb.ClientMessage) -> None:
        """Put a message on the stream; its answer is the next one ``answer`` takes after those sent before."""
        if self.closed:
            raise LinkDownError("the session stream is closed")
        if self._ended.is_set() and self._answers.empty():  # e.g. Close after a refusal ended the stream
            raise LinkDownError("the session stream has ended")
        self._requests.put(message)

    def request(self, message: pb.ClientMessage, timeout_s: float) -> pb.ServerMessage:
        """Send and wait for the answer."""
        self.send(message)
        return self.answer(timeout_s)

    def answer(self, timeout_s: float) -> pb.ServerMessage:
        """The next answer on the stream; LinkDownError on timeout or a broken stream."""
        if self._ended.is_set() and self._answers.empty():  # a message sent behind the one the stream ended on
            raise LinkDownError("the session stream has ended")
        try:
            answer = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise LinkDownError(f"no answer from the server within {timeout_s:.2f}s (link blackholed or server stuck)") from None
        if isinstance(answer, grpc.RpcError):
            raise classify_rpc_error(answer) from answer  # the server's status stays readable on __cause__
        if isinstance(answer, Exception):
            raise LinkDownError(f"session stream failed: {answer}")
        if answer is _END:
            raise LinkDownError("the server ended the session stream")
        return answer

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._requests.put(None)
            self._call.cancel()


class Reconnector:
    """Tries fresh channels in the background, with backoff, until one is ready (or it is cancelled).

    ``failures`` counts the consecutive failures before it (failed connects, calls that failed on a fresh
    channel): it first waits the backoff those earned, so a server that accepts connections but fails
    every call is retried at a falling rate, not as fast as connects succeed."""

    def __init__(self, config: LinkConfig, rng: random.Random | None = None, failures: int = 0):
        self.config = config
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._channel: grpc.Channel | None = None
        self.attempts = failures  # consecutive failures, its own failed connects included
        self._thread = threading.Thread(target=self._run, name="edgespec-reconnect", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self.attempts:
            self._stop.wait(backoff_delay(self.attempts - 1, self.config, self._rng))
        while not self._stop.is_set():
            channel = make_channel(self.config)
            if wait_ready(channel, self.config.connect_timeout_s):
                if self._stop.is_set():
                    channel.close()
                    return
                self._channel = channel
                self._ready.set()
                return
            channel.close()
            self.attempts += 1
            delay = backoff_delay(self.attempts - 1, self.config, self._rng)
            log.debug("reconnect attempt %d to %s failed; next in %.2fs", self.attempts, self.config.address, delay)
            self._stop.wait(delay)

    def take(self, timeout_s: float = 0.0) -> grpc.Channel | None:
        """The ready channel (once), waiting up to timeout_s; None if there is none yet."""
        if self._ready.wait(timeout_s) and self._channel is not None:
            channel, self._channel = self._channel, None
            self._ready.clear()
            return channel
        return None

    def cancel(self) -> None:
        self._stop.set()
        if self._channel is not None:
            self._channel.close()
            self._channel = None


class Link:
    """The current channel and the round-trip record that sets deadlines."""

    def __init__(self, config: LinkConfig, rng: random.Random | None = None):
        self.config = config
        self.rng = rng or random.Random()
        self.channel: grpc.Channel | None = None
        self.round_trips: list[tuple[int, float]] = []  # recent Draft round trips: (tree nodes, seconds)
        self.latest_by_size: dict[int, float] = {}  # tree nodes -> the last Draft of that size's round trip
        self.first_round_trip_s: float | None = None  # fallback before any Draft was timed

    def connect(self) -> None:
        self.close()
        self.channel = connect(self.config)

    def info(self) -> pb.InfoResponse:
        if self.channel is None:
            self.connect()
        return server_info(self.channel, self.config)

    def record(self, seconds: float, nodes: int = 0) -> None:
        self.round_trips.append((nodes, seconds))
        del self.round_trips[:-self.config.rtt_window]
        self.latest_by_size[nodes] = seconds

    def draft_deadline(self, nodes: int | None = None) -> float:
        return draft_deadline(self.round_trips, self.config, self.first_round_trip_s, nodes, self.latest_by_size)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


class GrpcTransport:
    """One session's messages over the link (the verifier's ``Transport``; ``verifier.py`` builds them): its
    Session stream, the deadline of each message, and a Reconnector while the link is down. The link's channel
    and round-trip record are the client's, shared by its sessions."""

    def __init__(self, link: Link):
        self.link = link
        self._stream: SessionStream | None = None
        self._reconnector: Reconnector | None = None

    def start(self, session_id: str) -> None:
        self._drop_stream()
        if self.link.channel is None:
            self.link.connect()
        self._stream = SessionStream(self.link.channel, self.link.config, session_id)

    def request(self, message: pb.ClientMessage) -> pb.ServerMessage:
        return self.send(message)()

    def send(self, message: pb.ClientMessage) -> Callable[[], pb.ServerMessage]:
        if self._stream is None:
            raise LinkDownError("not connected")
        kind, link, queued = message.WhichOneof("kind"), self.link, False
        if kind == "open":  # may prefill a long prompt (on a CPU, slowly)
            timeout_s = link.config.open_timeout_s
        elif kind == "resume":  # the link just came back: a silent server must not outlast the offline wait
            timeout_s = link.config.resume_timeout_s
        elif kind == "draft":  # a few times the recent round trips: a blackhole is found in about one
            nodes = len(message.draft.tree) // NODE_BYTES
            # decoding ahead costs up to `ahead` plain steps; its round trip is kept as one step's share of it
            ahead, queued = max(1, message.draft.decode_ahead), message.draft.queued
            timeout_s = min(link.config.max_deadline_s, link.draft_deadline(nodes) * ahead)
        else:  # Close: no work for the model
            timeout_s = min(2.0, link.draft_deadline())
        stream = self._stream
        stream.send(message)
        t0 = time.perf_counter()

        def answer() -> pb.ServerMessage:
            # The deadline runs from when the wait starts: a queued Draft waits first behind the answer before it,
            # and that wait, no round trip of the link's, is not recorded.
            got = stream.answer(timeout_s)
            if kind == "draft" and not queued:
                link.record((time.perf_counter() - t0) / ahead, nodes)
            elif kind == "open" and link.first_round_trip_s is None:  # the deadline's base until a Draft is timed
                link.first_round_trip_s = time.perf_counter() - t0
            return got
        return answer

    def disconnect(self, failures: int) -> None:
        self._drop_stream()
        self.link.close()
        self._reconnector = Reconnector(self.link.config, self.link.rng, failures)

    def reconnected(self, timeout_s: float) -> int | None:
        channel = self._reconnector.take(timeout_s) if self._reconnector else None
        if channel is None:
            return None
        self.link.close()
        self.link.channel = channel
        failures, self._reconnector = self._reconnector.attempts, None
        return failures

    def close(self) -> None:
        if self._reconnector is not None:
            self._reconnector.cancel()
            self._reconnector = None
        self._drop_stream()

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
