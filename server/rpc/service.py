"""The gRPC servicer: protobuf in, domain calls on ``VerifierCore``, protobuf out.

It runs on grpc.aio's event loop (see ``grpc_server.py``): Info is answered on
the loop; each Session message's work, which blocks on the model thread, runs
on a thread pool, so a stream waiting for its next message holds no thread.

Errors are mapped to gRPC statuses in one place (``status_of``): an
``EdgespecError`` carries its status in ``grpc_code``; anything else is
INTERNAL with the exception logged.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from concurrent.futures import Executor
from typing import AsyncIterator

import grpc
from google.protobuf.message import DecodeError, Message

from edgespec.proto.edgespec.v1 import pb, pb_grpc
from edgespec.server.core import VerifierCore
from edgespec.server.errors import AdmissionTimeoutError, InvalidRequestError, UnauthenticatedError, printable
from edgespec.server.features import check_feature_request
from edgespec.server.session import StepResult
from edgespec.shared import __version__
from edgespec.shared.codec import Codec
from edgespec.shared.errors import EdgespecError, TokenizerMismatchError
from edgespec.shared.models.registry import REGISTRY
from edgespec.shared.session_settings import SessionSettings, settings_of
from edgespec.shared.wire import (MAX_DETAILS_BYTES, MAX_SESSION_ID_CHARS, SERVER_STATUS_METADATA_KEY,
                                  SESSION_METADATA_KEY, FeatureKind, ResumePolicy)

log = logging.getLogger("edgespec.server")


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, EdgespecError):
        return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.INTERNAL), _deliverable(str(exc))
    return grpc.StatusCode.INTERNAL, _deliverable(
        f"internal server error ({type(exc).__name__}: {exc}); see the server log")


def _deliverable(message: str) -> str:
    data = message.encode("utf-8")
    if len(data) <= MAX_DETAILS_BYTES:
        return message
    return data[:MAX_DETAILS_BYTES].decode("utf-8", "ignore") + f" ... (cut from {len(data)} bytes)"


class Unparsable:
    """Bytes on a call that are not the message the method takes (a peer of another protocol, or garbage).

    The parser hands this to the handler instead of raising, because a parser that raises makes grpc log
    a traceback per message; the handler refuses it with INVALID_ARGUMENT and one log line."""

    def __init__(self, message_type: type[Message], size: int, error: Exception):
        self.error = InvalidRequestError(
            f"{size} bytes that are not an {message_type.DESCRIPTOR.full_name} ({error}): "
            f"is the peer an edgespec client of the same wire version (edgespec.v1)?")


def _parser(message_type: type[Message]):
    def parse(data: bytes) -> Message | Unparsable:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return Unparsable(message_type, len(data), exc)

    return parse


def add_to_server(servicer: "VerifierServicer", server: grpc.aio.Server) -> None:
    """``pb_grpc.add_VerifierServicer_to_server`` with ``_parser``s in place of the raising ``FromString``."""
    service = pb.DESCRIPTOR.services_by_name["Verifier"]
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for method in service.methods:
        make = kinds[(method.client_streaming, method.server_streaming)]
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[method.name] = make(getattr(servicer, method.name), request_deserializer=_parser(request),
                                     response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(self, core: VerifierCore, api_key: str | None = None, pool: Executor | None = None,
                 first_message_timeout_s: float = 5.0):
        self.core = core
        self.api_key = api_key
        self.pool = pool  # runs each Session message's work; None = the event loop's default executor
        self.first_message_timeout_s = first_message_timeout_s  # a silent new stream is closed after this

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        try:
            self._authenticate(context)
            if isinstance(request, Unparsable):
                raise request.error
            return self._info()
        except Exception as exc:  # noqa: BLE001 - every error becomes a status, in one place
            await self._abort(context, exc)

    def _info(self) -> pb.InfoResponse:
        t, lim, curve = self.core.target, self.core.limits, self.core.cost_curve  # curve None: not measured
        cost = {} if curve is None else dict(verify_cost_nodes=curve.nodes, verify_cost_ns=curve.total_ns,
                                             verify_cost_context=curve.context)
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
            moa_server_parts=sorted(self.core.lsa_parts), eos_token_ids=sorted(t.eos_ids),
            registry_name=t.loaded.name if t.loaded.name in REGISTRY else "", **cost)

    async def Session(self, request_iterator: AsyncIterator[pb.ClientMessage],
                      context: grpc.aio.ServicerContext) -> None:
        # context.read/write rather than the iterators: only they let the first read have a deadline.
        try:
            self._authenticate(context)
            meta_id = dict(context.invocation_metadata()).get(SESSION_METADATA_KEY, "")
            wait_s: float | None = self.first_message_timeout_s
            while True:
                message = await self._read(context, wait_s)
                wait_s = None  # only the first message is due at once: a session may idle between steps
                if message is grpc.aio.EOF:
                    return
                reply = await asyncio.get_running_loop().run_in_executor(self.pool, self.answer, message, meta_id)
                await context.write(reply)
                if reply.HasField("closed"):
                    return
        except Exception as exc:  # noqa: BLE001
            await self._abort(context, exc)

    async def _read(self, context: grpc.aio.ServicerContext, wait_s: float | None):
        try:
            message = await asyncio.wait_for(context.read(), wait_s)
        except TimeoutError:
            raise AdmissionTimeoutError(
                f"the Session stream sent no first message within {wait_s:g} s of opening: send Open (or Resume) "
                f"as soon as the stream is open; silent streams are closed so they cannot hold the server") from None
        if isinstance(message, Unparsable):
            raise message.error
        return message

    def answer(self, message: pb.ClientMessage, meta_id: str) -> pb.ServerMessage:
        """One Session message's work (meta_id: the session id in the stream's metadata). It blocks while the
        model thread runs the step: the stream runs it on the pool; the client's in-process transport calls it."""
        self.core.metrics.bytes_in.inc(message.ByteSize())
        reply = self._handle(message, meta_id)
        self.core.metrics.bytes_out.inc(reply.ByteSize())
        return reply

    def _handle(self, message: pb.ClientMessage, meta_id: str) -> pb.ServerMessage:
        kind = message.WhichOneof("kind")
        if kind == "open":
            o = message.open
            sid = _session_id(o.session_id, meta_id, allow_new=True)
            # The repeated fields go as they are (len() is free): the length check comes before any per-id work.
            result = self.core.open(self._settings(o, sid), o.prompt_ids, o.tree)
            return pb.ServerMessage(opened=pb.Opened(first_token=result.next_token, accepted=list(result.accepted),
                                                     cached_tokens=result.cached_tokens, **_shared(sid, result)))
        if kind == "draft":
            d = message.draft
            sid = _session_id(d.session_id, meta_id)
            result = self.core.verify(sid, d.step, d.committed_len, d.tree, d.decode_ahead, d.queued)
            return pb.ServerMessage(verified=pb.Verified(
                step=d.step, accepted=list(result.accepted), bonus_token=result.next_token,
                decoded=list(result.decoded), skipped=result.skipped, **_shared(sid, result)))
        if kind == "resume":
            r = message.resume
            sid = _session_id(r.session_id, meta_id)
            reopen = self._settings(r.reopen, sid) if r.HasField("reopen") else None
            try:
                policy = ResumePolicy(r.policy)
            except ValueError:
                raise InvalidRequestError(f"unknown resume policy {r.policy}") from None
            result = self.core.resume(sid, r.committed_len, r.committed_hash, r.committed_ids,
                                      r.provisional_ids, policy, reopen)
            return pb.ServerMessage(resumed=pb.Resumed(agreed=result.agreed, restored=result.restored,
                                                       bonus_token=result.next_token, **_shared(sid, result)))
        if kind == "close":
            sid = _session_id(message.close.session_id, meta_id)
            self.core.close(sid)
            return pb.ServerMessage(closed=pb.Closed(session_id=sid))
        raise InvalidRequestError("empty ClientMessage: set one of open, draft, resume, close")

    def _settings(self, o: pb.Open, session_id: str) -> SessionSettings:
        """Open's settings as a domain object; refuses a foreign tokenizer, bad sampling or codec settings and
        features this server cannot send."""
        target = self.core.target
        if o.tokenizer_fingerprint != target.fingerprint:
            raise TokenizerMismatchError(
                f"tokenizer fingerprint {o.tokenizer_fingerprint[:16] or '(empty)'}... is not this server's "
                f"({target.fingerprint[:16]}..., model {target.name}): the client must use the target's tokenizer "
                f"(see Info.tokenizer_fingerprint)")
        settings = settings_of(o, session_id)
        check_feature_request(settings.features, target.num_layers, self.core.lsa_parts)
        return settings

    def _authenticate(self, context: grpc.ServicerContext) -> None:
        from edgespec.shared.auth import api_key_problem

        problem = api_key_problem(dict(context.invocation_metadata()), self.api_key)
        if problem is not None:
            raise UnauthenticatedError(problem)

    async def _abort(self, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        if context.done():  # the client went away; nobody to tell
            log.info("stream ended by the client: %s", printable(str(exc)))
            return
        code, message = self.refused(exc)
        await context.abort(code, message, trailing_metadata=((SERVER_STATUS_METADATA_KEY, code.name),))

    def refused(self, exc: BaseException) -> tuple[grpc.StatusCode, str]:
        """The status a call ends with for this error, counted and logged (once per call)."""
        code, message = status_of(exc)
        self.core.metrics.errors.labels(code=code.name).inc()
        if code is grpc.StatusCode.INTERNAL:
            log.error("internal error: %s", printable(str(exc)), exc_info=exc)
        else:
            log.info("refused with %s: %s", code.name, printable(message))
        return code, message


def _session_id(in_message: str, in_metadata: str, allow_new: bool = False) -> str:
    _check_session_id(in_message, "in the message")
    _check_session_id(in_metadata, f"in the call metadata {SESSION_METADATA_KEY!r}")
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


def _check_session_id(sid: str, where: str) -> None:
    if len(sid) > MAX_SESSION_ID_CHARS:
        raise InvalidRequestError(f"the session id {where} is {len(sid)} characters long; at most "
                                  f"{MAX_SESSION_ID_CHARS} printable characters are allowed (a UUID is 36)")
    bad = next((i for i, c in enumerate(sid) if not c.isprintable()), None)
    if bad is not None:
        raise InvalidRequestError(f"the session id {where} holds a non-printable character "
                                  f"({printable(sid[bad])} at index {bad}); use printable characters only")


def _shared(session_id: str, result: StepResult) -> dict:
    """The fields Opened, Verified and Resumed have in common."""
    return dict(session_id=session_id, committed_len=result.committed_len,
                features=[pb.Feature(name=name, frame=frame) for name, frame in result.features],
                timings=pb.Timings(**dataclasses.asdict(result.timings)),
                logprobs=[pb.TokenLogprob(logprob=t.logprob, top_ids=[i for i, _ in t.top],
                                          top_logprobs=[lp for _, lp in t.top]) for t in result.logprobs])
