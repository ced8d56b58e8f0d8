"""The gRPC servicer: protobuf in, domain calls on ``VerifierCore``, protobuf out.

Errors are mapped to gRPC statuses in one place (``_status_of``): an
``EdgespecError`` carries its status in ``grpc_code``; anything else is
INTERNAL with the exception logged.
"""
from __future__ import annotations

import hmac
import logging
import uuid
from typing import Iterable, Iterator

import grpc

from edgespec.proto.edgespec.v1 import pb, pb_grpc
from edgespec.shared import __version__
from edgespec.shared.codec import ActivationCodec, Codec
from edgespec.shared.errors import EdgespecError, FrameError, TokenizerMismatchError
from edgespec.shared.verification import SamplingConfig

from .core import VerifierCore
from .errors import InvalidRequestError, UnauthenticatedError
from .features import FeatureKind, FeatureSpec, check_feature_request
from .session import ResumePolicy, SessionSettings, StepResult

log = logging.getLogger("edgespec.server")

SESSION_METADATA_KEY = "x-edgespec-session"


def _status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, EdgespecError):
        return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.INTERNAL), str(exc)
    return grpc.StatusCode.INTERNAL, f"internal server error ({type(exc).__name__}: {exc}); see the server log"


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(self, core: VerifierCore, api_key: str | None = None):
        self.core = core
        self.api_key = api_key

    # ------------------------------------------------------------------ Info
    def Info(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.InfoResponse:
        try:
            self._authenticate(context)
            return self._info()
        except Exception as exc:  # noqa: BLE001 - every error becomes a status, in one place
            self._abort(context, exc)

    def _info(self) -> pb.InfoResponse:
        t, lim = self.core.target, self.core.limits
        return pb.InfoResponse(
            model_name=t.name, vocab_size=t.vocab_size, tokenizer_fingerprint=t.fingerprint,
            hidden_size=t.hidden_size, num_layers=t.num_layers, num_kv_heads=t.num_kv_heads,
            head_dim=t.head_dim, kv_size=t.kv_size,
            feature_kinds=[k.value for k in FeatureKind if k is not FeatureKind.MOA or self.core.lsa_parts],
            codecs=[c.value for c in Codec],
            limits=pb.ServerLimits(max_tree_nodes=lim.max_tree_nodes, max_context_tokens=lim.max_context_tokens,
                                   max_sessions=lim.store.max_sessions, max_message_bytes=lim.max_message_bytes,
                                   session_ttl_s=int(lim.store.ttl_s)),
            server_version=__version__, device=str(t.device), dtype=str(t.dtype).removeprefix("torch."),
            moa_server_parts=sorted(self.core.lsa_parts), eos_token_ids=sorted(t.eos_ids))

    # --------------------------------------------------------------- Session
    def Session(self, request_iterator: Iterable[pb.ClientMessage],
                context: grpc.ServicerContext) -> Iterator[pb.ServerMessage]:
        try:
            self._authenticate(context)
            meta_id = dict(context.invocation_metadata()).get(SESSION_METADATA_KEY, "")
            for message in request_iterator:
                self.core.metrics.bytes_in.inc(message.ByteSize())
                reply = self._handle(message, meta_id)
                self.core.metrics.bytes_out.inc(reply.ByteSize())
                yield reply
                if reply.HasField("closed"):
                    return
        except Exception as exc:  # noqa: BLE001
            self._abort(context, exc)

    def _handle(self, message: pb.ClientMessage, meta_id: str) -> pb.ServerMessage:
        kind = message.WhichOneof("kind")
        if kind == "open":
            o = message.open
            sid = _session_id(o.session_id, meta_id, allow_new=True)
            result = self.core.open(self._settings(o, sid), list(o.prompt_ids), o.tree)
            return pb.ServerMessage(opened=pb.Opened(
                session_id=sid, first_token=result.next_token, committed_len=result.committed_len,
                features=_features(result), timings=_timings(result), accepted=list(result.accepted)))
        if kind == "draft":
            d = message.draft
            sid = _session_id(d.session_id, meta_id)
            result = self.core.verify(sid, d.step, d.committed_len, d.tree)
            return pb.ServerMessage(verified=pb.Verified(
                session_id=sid, step=d.step, accepted=list(result.accepted), bonus_token=result.next_token,
                committed_len=result.committed_len, features=_features(result), timings=_timings(result)))
        if kind == "resume":
            r = message.resume
            sid = _session_id(r.session_id, meta_id)
            reopen = self._settings(r.reopen, sid) if r.HasField("reopen") else None
            try:
                policy = ResumePolicy(r.policy)
            except ValueError:
                raise InvalidRequestError(f"unknown resume policy {r.policy}") from None
            result = self.core.resume(sid, r.committed_len, r.committed_hash, list(r.committed_ids),
                                      list(r.provisional_ids), policy, reopen)
            return pb.ServerMessage(resumed=pb.Resumed(
                session_id=sid, agreed=result.agreed, restored=result.restored, bonus_token=result.next_token,
                committed_len=result.committed_len, features=_features(result), timings=_timings(result)))
        if kind == "close":
            sid = _session_id(message.close.session_id, meta_id)
            self.core.close(sid)
            return pb.ServerMessage(closed=pb.Closed(session_id=sid))
        raise InvalidRequestError("empty ClientMessage: set one of open, draft, resume, close")

    def _settings(self, o: pb.Open, session_id: str) -> SessionSettings:
        """Open's settings as a domain object; refuses a foreign tokenizer and bad sampling or codec settings."""
        target = self.core.target
        if o.tokenizer_fingerprint != target.fingerprint:
            raise TokenizerMismatchError(
                f"tokenizer fingerprint {o.tokenizer_fingerprint[:16] or '(empty)'}... is not this server's "
                f"({target.fingerprint[:16]}..., model {target.name}): the client must use the target's tokenizer "
                f"(see Info.tokenizer_fingerprint)")
        try:
            sampling = SamplingConfig(o.sampling.temperature, o.sampling.top_p or 1.0, o.sampling.top_k)
        except ValueError as exc:
            raise InvalidRequestError(f"bad sampling parameters: {exc}") from None
        lsa = check_feature_request(o.features.kind, o.features.tli_layers, target.num_layers,
                                    o.features.moa_server_part, self.core.lsa_parts)
        try:
            # No CodecChoice: the default frame (int8 + outliers, zstd 3). outlier_channels 0 means the default 8.
            codec = ActivationCodec() if not o.HasField("codec") else ActivationCodec(
                Codec(o.codec.codec or Codec.INT8_OUTLIER), o.codec.zstd_level, o.codec.outlier_channels or 8)
        except ValueError as exc:
            raise FrameError(f"bad codec choice: {exc}") from None
        features = FeatureSpec(FeatureKind(o.features.kind), codec, lsa, o.features.tli_layers)
        return SessionSettings(session_id, sampling, o.sampling.seed, features, o.max_new_tokens, o.drafter)

    # --------------------------------------------------------------- helpers
    def _authenticate(self, context: grpc.ServicerContext) -> None:
        if not self.api_key:
            return
        meta = dict(context.invocation_metadata())
        given = meta.get("x-api-key") or meta.get("authorization", "").removeprefix("Bearer ").strip()
        if not given:
            raise UnauthenticatedError("this server needs an API key: send call metadata "
                                       "'authorization: Bearer KEY' (or 'x-api-key: KEY')")
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise UnauthenticatedError("the API key sent is not this server's")

    def _abort(self, context: grpc.ServicerContext, exc: BaseException) -> None:
        if not context.is_active():  # the client went away; nobody to tell
            log.info("stream ended by the client: %s", exc)
            return
        code, message = _status_of(exc)
        self.core.metrics.errors.labels(code=code.name).inc()
        if code is grpc.StatusCode.INTERNAL:
            log.exception("internal error: %s", exc)
        else:
            log.info("refused with %s: %s", code.name, message)
        context.abort(code, message)


def _session_id(in_message: str, in_metadata: str, allow_new: bool = False) -> str:
    if in_message and in_metadata and in_message != in_metadata:
        raise InvalidRequestError(f"session id {in_message!r} in the message differs from {in_metadata!r} in "
                                  f"the call metadata {SESSION_METADATA_KEY!r}")
    sid = in_message or in_metadata
    if not sid:
        if not allow_new:
            raise InvalidRequestError(f"no session id: set it in the message or the call metadata "
                                      f"{SESSION_METADATA_KEY!r}")
        sid = str(uuid.uuid4())
    return sid


def _features(result: StepResult) -> list[pb.Feature]:
    return [pb.Feature(name=name, frame=frame) for name, frame in result.features]


def _timings(result: StepResult) -> pb.Timings:
    t = result.timings
    return pb.Timings(queue_ns=t.queue_ns, forward_ns=t.forward_ns, verify_ns=t.verify_ns,
                      encode_ns=t.encode_ns, total_ns=t.total_ns)
