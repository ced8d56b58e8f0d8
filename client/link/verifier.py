"""The verifier as the generation loop sees it: open, verify, resume, close, on domain types.

This is the client's mirror of ``edgespec.server.rpc.service``: the one place where a
session's requests become protobuf messages and the answers come back as
dataclasses (features decoded by name, the server's timings), and where what
crosses the link is counted. How a message reaches the server is a
``Transport``'s business: ``GrpcTransport`` (``grpc_transport.py``) sends it on a gRPC
Session stream; ``InProcessTransport`` (``in_process.py``) hands it to the
servicer of a ``VerifierCore`` in this process, with no sockets.

Both transports fail the same way, and the loop acts on the kind of error:
- ``LinkDownError``: the link is the problem (no answer in time, a broken stream,
  UNAVAILABLE): go offline, reconnect, resume.
- ``SessionLostError`` (a ``LinkDownError``): the server no longer holds the
  session: Resume rebuilds it.
- ``ServerRefusedError``: the server's answer to the request itself (a refusal,
  a server-side bug): retrying would get it again.
- ``ProtocolError`` (also raised by ``loop/verdict.py``'s rules): an answer that contradicts the request.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

import torch

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.codec import decode_frame, frame_element_limit, frame_shape
from edgespec.shared.errors import EdgespecError
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.logprobs import TokenLogprob
from edgespec.shared.metrics import LinkTraffic
from edgespec.shared.session_contract import ServerTimings
from edgespec.shared.session_settings import FeatureRequest, SessionSettings, open_fields
from edgespec.shared.tree import DraftTree, encode_tree
from edgespec.shared.wire import MAX_ELEMENTS, FeatureKind, ResumePolicy

log = logging.getLogger(__name__)


class LinkDownError(EdgespecError):
    """The server could not be reached, the stream broke, or an answer did not come in time."""

    grpc_code = "UNAVAILABLE"


class SessionLostError(LinkDownError):
    """The server no longer knows the session (expired, evicted, other replica): Resume rebuilds it."""

    grpc_code = "NOT_FOUND"


class ServerRefusedError(EdgespecError):
    """The server answered with an error that retrying will not fix (bad request, wrong tokenizer, no auth,
    a server-side bug): the request fails with the server's message."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, message: str, code: str = "FAILED_PRECONDITION"):
        super().__init__(message)
        self.grpc_code = code


class ProtocolError(EdgespecError):
    """The server's answer contradicts the request (wrong step, accepted nodes not a path, lengths off)."""

    grpc_code = "INTERNAL"


@dataclass(frozen=True)
class FeatureWidths:
    """The target's sizes that fix how many values a feature frame carries per token (from Info)."""

    hidden_size: int  # E: HIDDEN's width
    kv_size: int  # E_kv: LSA is 2*E_kv wide; TLI_K and TLI_V carry N*E_kv values per token

    def per_token(self, needs: FeatureRequest) -> int:
        """The most values any one feature frame of this session carries per token (0: no frames at all)."""
        kind = FeatureKind(needs.kind)
        if kind is FeatureKind.NONE:
            return 0
        if kind is FeatureKind.LAST_HIDDEN:
            return self.hidden_size
        return max(2 * self.kv_size, needs.tli_layers * self.kv_size)


@dataclass(frozen=True)
class Verdict:
    """The target's answer to Open, Draft or Resume, in vLLM's words (accepted tokens, bonus token)."""

    bonus_token: int  # the target's own token after the accepted ones (Open's first token, Resume's next one)
    committed_len: int  # the session's committed length after this answer, bonus token included
    accepted: tuple[int, ...] = ()  # Open with a tree, Draft: the accepted node indices, root to leaf
    agreed: int = 0  # Resume: leading provisional tokens equal to the target's own choice
    restored: bool = True  # Resume: False when the server had lost the session and re-prefilled it
    features: Mapping[str, torch.Tensor] = field(default_factory=dict)  # decoded, by wire name (``shared.wire``)
    timings: ServerTimings = ServerTimings()  # the server's time on it
    logprobs: tuple[TokenLogprob, ...] = ()  # with SessionSettings.logprobs: one per token this answer committed
    decoded: tuple[int, ...] = ()  # a Draft with decode_ahead: the target's tokens before bonus_token
    skipped: bool = False  # a queued Draft the server skipped: the step before it ended short (nothing else set)


class Transport(Protocol):
    """How one session's messages reach the verifier, and how the link comes back after it failed."""

    def start(self, session_id: str) -> None:
        """A new stream for the session (Open and Resume come first on one); connects if there is no link."""

    def send(self, message: pb.ClientMessage) -> Callable[[], pb.ServerMessage]:
        """Send one message now; the call returned waits for its one answer, within the deadline its kind gets.
        Answers come in the order the messages went: wait for them in that order."""

    def disconnect(self, failures: int) -> None:
        """The link failed (``failures`` times in a row): drop it and reconnect in the background, after the
        backoff those failures earned."""

    def reconnected(self, timeout_s: float) -> int | None:
        """Wait up to timeout_s for the background reconnect: None while the link is down; once it is back,
        the consecutive failures so far (its own failed connects included)."""

    def close(self) -> None:
        """Drop the stream and stop reconnecting."""


class Verifier:
    """One session with the target's verifier, over a transport. Each call raises the errors listed above."""

    def __init__(self, transport: Transport, widths: FeatureWidths | None = None):
        self.transport = transport
        # Bounds every feature frame by what the answer can carry (its tokens x the feature width); None: only the
        # codec's own MAX_ELEMENTS (a caller that does not know the target's sizes).
        self.widths = widths
        self.traffic = LinkTraffic()  # every message of the session, failed ones included
        self._open: pb.Open | None = None  # the session's Open without a tree: Resume carries it as reopen
        self._settings: SessionSettings | None = None  # the session's (its feature request bounds its frames)
        self._streaming = False  # a stream was started and not dropped since

    def open(self, settings: SessionSettings, prompt_ids: Sequence[int], tree: DraftTree | None = None) -> Verdict:
        """Prefill the prompt (and verify a tree hung from its last token in the same pass)."""
        self._open = pb.Open(**open_fields(settings, prompt_ids))  # no tree: a rebuilt session starts from the prompt
        self._start(settings.session_id)
        self._settings = settings
        message = pb.Open(**open_fields(settings, prompt_ids, encode_tree(tree) if tree is not None else b""))
        opened = self._call(pb.ClientMessage(open=message), "opened")
        if tree is None and len(opened.accepted):
            raise ProtocolError("Opened lists accepted nodes but the Open carried no tree")
        return self._verdict(opened, opened.first_token, len(opened.accepted) + 1, accepted=opened.accepted,
                             rows=len(prompt_ids) + (len(tree) if tree is not None else 0) + 1)

    def verify(self, step: int, committed_len: int, tree: DraftTree, decode_ahead: int = 1) -> Verdict:
        """Verify a tree hung from the last of committed_len committed tokens; with an empty tree and
        decode_ahead > 1, the target decodes up to that many tokens on its own (``Verdict.decoded`` + bonus)."""
        return self.send_draft(step, committed_len, tree, decode_ahead)()

    def send_draft(self, step: int, committed_len: int, tree: DraftTree, decode_ahead: int = 1,
                   queued: bool = False) -> Callable[[], Verdict]:
        """``verify`` in two halves: the Draft goes now, the call returned waits for its Verdict. queued: sent
        before the answer to the Draft before it, hung from where that one leaves the text (``Draft.queued``)."""
        draft = pb.Draft(session_id=self._open.session_id, step=step, committed_len=committed_len,
                         tree=encode_tree(tree), decode_ahead=decode_ahead if decode_ahead > 1 else 0, queued=queued)
        answer = self._send(pb.ClientMessage(draft=draft), "verified", timed=not queued)

        def verdict() -> Verdict:
            verified = answer()
            if verified.step != step:
                raise ProtocolError(f"Verified answers step {verified.step}, the client sent step {step}")
            if verified.skipped:
                if not queued:
                    raise ProtocolError(f"Verified skipped step {step}, which was not queued")
                return Verdict(bonus_token=0, committed_len=verified.committed_len, skipped=True)
            if len(verified.decoded) >= max(1, decode_ahead) or (verified.decoded and verified.accepted):
                raise ProtocolError(f"Verified decoded {len(verified.decoded)} tokens before its bonus token (and "
                                    f"accepted {len(verified.accepted)} nodes) where the Draft asked for "
                                    f"{decode_ahead} in all")
            committed = len(verified.accepted) + len(verified.decoded) + 1
            return self._verdict(verified, verified.bonus_token, committed, accepted=verified.accepted,
                                 decoded=verified.decoded, rows=max(len(tree) + 1, decode_ahead))
        return verdict

    def resume(self, confirmed: Sequence[int], provisional: Sequence[int], policy: ResumePolicy,
               step: int) -> Verdict:
        """On a new stream: the server restores the session to the confirmed ids (or rebuilds it from them),
        verifies the provisional ones as a chain and commits under the policy."""
        resume = pb.Resume(session_id=self._open.session_id, committed_len=len(confirmed),
                           committed_hash=committed_hash(list(confirmed)), committed_ids=confirmed,
                           provisional_ids=provisional, policy=int(policy), reopen=self._open, step=step)
        self._start(self._open.session_id)
        resumed = self._call(pb.ClientMessage(resume=resume), "resumed")
        kept = len(provisional) if policy is ResumePolicy.KEEP else min(resumed.agreed, len(provisional))
        return self._verdict(resumed, resumed.bonus_token, kept + 1, agreed=resumed.agreed, restored=resumed.restored,
                             rows=len(confirmed) + len(provisional) + 1)

    def close(self) -> None:
        """End the session: Close it on the server while a stream is up, then drop the link's session state.
        Best effort: a Close that is lost only leaves the session to the server's idle TTL."""
        if self._streaming:
            try:
                self._call(pb.ClientMessage(close=pb.Close(session_id=self._open.session_id)), "closed")
            except Exception as err:  # noqa: BLE001 - the output is complete whatever happens here
                log.debug("Close failed: %s", err)
        self._streaming = False
        self.transport.close()

    def disconnect(self, failures: int) -> None:
        """The link failed: see ``Transport.disconnect``."""
        self._streaming = False
        self.transport.disconnect(failures)

    def reconnected(self, timeout_s: float) -> int | None:
        """See ``Transport.reconnected``."""
        return self.transport.reconnected(timeout_s)

    def _start(self, session_id: str) -> None:
        self.transport.start(session_id)
        self._streaming = True

    def _verdict(self, body, bonus_token: int, committed: int, accepted: Sequence[int] = (), agreed: int = 0,
                 restored: bool = True, decoded: Sequence[int] = (), rows: int = 0) -> Verdict:
        """An Opened, Verified or Resumed as a Verdict (a Resume's chain has no nodes: it reports `agreed`);
        `committed`: how many tokens the answer commits, the bonus token included; `rows`: the most tokens its
        features can cover (what the client sent, plus one)."""
        limit = MAX_ELEMENTS if self.widths is None else frame_element_limit(
            rows, self.widths.per_token(self._settings.features))
        return Verdict(bonus_token=bonus_token, committed_len=body.committed_len, accepted=tuple(accepted),
                       agreed=agreed, restored=restored, decoded=tuple(decoded),
                       features={f.name: decode_frame(f.frame, limit) for f in body.features},
                       timings=ServerTimings.of(body.timings),
                       logprobs=_logprobs(body, committed, self._open.HasField("logprobs")))

    def _call(self, message: pb.ClientMessage, expect: str):
        """Send, count, check the answer's kind; returns the answer's body (``Opened``, ``Verified``, ...)."""
        return self._send(message, expect)()

    def _send(self, message: pb.ClientMessage, expect: str, timed: bool = True) -> Callable[[], object]:
        """``_call`` in two halves (timed=False: the wait is no round trip of the link's, so it is not kept)."""
        self.traffic.bytes_up += message.ByteSize()
        t0 = time.perf_counter()
        wait = self.transport.send(message)
        return lambda: self._received(wait(), expect, time.perf_counter() - t0 if timed else None)

    def _received(self, answer: pb.ServerMessage, expect: str, round_trip_s: float | None):
        t = self.traffic
        if round_trip_s is not None:
            t.round_trips_s.append(round_trip_s)
        t.bytes_down += answer.ByteSize()
        if expect != "closed":  # a Close is no work for the model
            t.calls += 1
        kind = answer.WhichOneof("kind")
        if kind != expect:
            raise ProtocolError(f"expected {expect!r} from the server, got {kind!r}")
        body = getattr(answer, kind)
        for f in getattr(body, "features", ()):
            t.feature_bytes += len(f.frame)
            t.feature_raw_bytes += 2 * math.prod(frame_shape(f.frame))
        return body


def _logprobs(body, committed: int, wanted: bool) -> tuple[TokenLogprob, ...]:
    """The answer's logprobs, one per token it committed when the session asked for them."""
    if len(body.logprobs) != (committed if wanted else 0):
        raise ProtocolError(f"the server sent {len(body.logprobs)} logprobs for {committed} committed tokens"
                            + ("" if wanted else " the session did not ask for"))
    return tuple(TokenLogprob(t.logprob, tuple(zip(t.top_ids, t.top_logprobs))) for t in body.logprobs)
