"""A verifier in this process: the loop's messages go to a ``VerifierCore`` with no sockets.

``Verifier(InProcessTransport(VerifierServicer(core)))`` has the interface of the gRPC-backed
``Verifier(GrpcTransport(link))``. The transport hands each message to the gRPC servicer's own handler
(``VerifierServicer.answer``), so an answer is what the gRPC server would send,
and a server error becomes the client error the gRPC transport raises for the
same status (``classify_status``). What it leaves out is the network: a
generation over it takes milliseconds with a tiny model, which makes the
offline/resume state machine testable step by step.

The link can still fail, on purpose: ``fail_next`` (the reconnect then succeeds at once), or ``cut`` until
``restore``; ``round_trip_s`` delays every answer as a link would, so the pipelined loop has a verification in
flight to draft behind.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from edgespec.proto.edgespec.v1 import pb

from .grpc_transport import classify_status
from .verifier import LinkDownError


class InProcessTransport:
    """The verifier's ``Transport`` to a ``VerifierCore`` in this process."""

    def __init__(self, servicer, round_trip_s: float = 0.0):
        # The server's VerifierServicer over that core, built by the caller: the client package never imports
        # the server's (tests/shared/test_layering.py).
        self.servicer = servicer
        self.round_trip_s = round_trip_s  # every answer comes this much later (a link's round trip)
        self._session_id: str | None = None  # the session of the stream started last (None: no stream)
        self._ended = False  # the server ended that stream with an error: like gRPC, it answers no more
        self._up = threading.Event()  # the link works (reconnecting waits on it)
        self._up.set()
        self._failing = 0  # requests still to fail
        self._answered = False  # a failing request is handled by the server, only its answer is lost
        self._failures = 0  # consecutive failures handed to disconnect, reported back on reconnect

    # ------------------------------------------------------------ outages
    def fail_next(self, count: int = 1, answered: bool = False) -> None:
        """The next `count` requests fail with LinkDownError; with answered=True the server handles each
        (its session moves on) and only the answer is lost."""
        self._failing, self._answered = count, answered

    def cut(self) -> None:
        """The link goes down until ``restore``: requests fail and reconnecting waits."""
        self._up.clear()

    def restore(self) -> None:
        self._up.set()

    # ---------------------------------------------------------- transport
    def start(self, session_id: str) -> None:
        if not self._up.is_set():
            raise LinkDownError("cannot reach the in-process verifier: the link is cut")
        self._session_id, self._ended = session_id, False

    def send(self, message: pb.ClientMessage) -> Callable[[], pb.ServerMessage]:
        # The server works on a message when its answer is waited for: answers are waited for in the order sent,
        # so the server sees the messages in that order, as on a stream.
        return lambda: self.request(message)

    def request(self, message: pb.ClientMessage) -> pb.ServerMessage:
        if self.round_trip_s:  # on the way: a cut meanwhile loses the request
            time.sleep(self.round_trip_s)
        if self._session_id is None:
            raise LinkDownError("not connected")
        if self._ended:
            raise LinkDownError("the session stream has ended")
        if not self._up.is_set():
            raise LinkDownError("no answer from the in-process verifier: the link is cut")
        failing = self._failing > 0
        if failing and not self._answered:
            self._failing -= 1
            raise LinkDownError("link to the in-process verifier failed before the request arrived")
        try:
            answer = self.servicer.answer(message, self._session_id)
        except Exception as exc:  # noqa: BLE001 - every server error becomes what the gRPC status would
            self._ended = True
            raise classify_status(*self.servicer.refused(exc)) from None
        if failing:
            self._failing -= 1
            raise LinkDownError("link to the in-process verifier failed before the answer arrived")
        return answer

    def disconnect(self, failures: int) -> None:
        self._session_id, self._failures = None, failures

    def reconnected(self, timeout_s: float) -> int | None:
        return self._failures if self._up.wait(timeout_s) else None

    def close(self) -> None:
        self._session_id = None

