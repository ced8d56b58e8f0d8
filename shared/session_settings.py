"""What Open fixes for a session, on both sides, and its wire form (``edgespec.v1.Open``).

The client builds ``SessionSettings`` and sends it with Open (and again in Resume, so that a server that lost the
session can rebuild it); the server reads the same type back and its session keeps it. ``open_fields`` and
``settings_of`` are the one pair of converters, and the only place that knows proto3's zeros: an unset number
reads as 0, so where 0 is no valid value (top_p, repetition_penalty, the codec and its outlier channels) it
means the default. They touch no protobuf class: ``open_fields`` gives the keyword arguments of ``pb.Open``
(sub-messages as dicts, which its constructor takes), ``settings_of`` reads any object with Open's fields, so
protobuf stays in the two adapters (``client/link/verifier.py``, ``server/rpc/service.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .codec import DEFAULT_OUTLIER_CHANNELS, ActivationCodec, Codec
from .errors import FrameError, InvalidRequestError
from .session_contract import SamplingSettings
from .wire import MAX_TOP_LOGPROBS, FeatureKind


@dataclass(frozen=True)
class FeatureRequest:
    """What the drafter asks the server to send back per verified token (the wire's ``FeatureRequest``)."""

    kind: FeatureKind = FeatureKind.NONE  # which features, if any
    moa_server_part: str = ""  # MoA: name of the Layer Self-Attention weights on the server
    tli_layers: int = 0  # MoA: Target Layer Inference depth N


@dataclass(frozen=True)
class SessionSettings:
    """What Open fixes for the whole session (its prompt and first tree travel beside it)."""

    session_id: str  # chosen by the client (a UUID); the server makes one for an Open that names none
    sampling: SamplingSettings = SamplingSettings()  # greedy unless temperature > 0; penalties, logit_bias
    seed: int = 0  # keys the session's sampling draws: same seed, same output, whatever the trees
    features: FeatureRequest = FeatureRequest()  # what each answer carries back
    max_new_tokens: int = 0  # the client's budget (informational; the server enforces the context limit)
    drafter: str = ""  # the client's drafter name, for the server's logs and metrics
    logprobs: int | None = None  # None: no logprobs; k: each committed token's and the k most likely
    grammar: str = ""  # llguidance grammar (shared.grammar) the output must follow; '' = none
    prompt_len: int = 0  # the server's: Open's prompt length, where the output the penalties count starts
    codec: ActivationCodec = ActivationCodec()  # how the server encodes the features
    tokenizer_fingerprint: str = ""  # the client's tokenizer: the server refuses one that is not its own


def open_fields(s: SessionSettings, prompt_ids, tree: bytes = b"") -> dict:
    """The keyword arguments of the wire's Open carrying `s`, the prompt and a first tree (encoded)."""
    p, n, c = s.sampling, s.features, s.codec
    return dict(
        session_id=s.session_id, prompt_ids=prompt_ids,
        sampling=dict(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=s.seed, min_p=p.min_p,
                      presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                      repetition_penalty=p.repetition_penalty, logit_bias=dict(p.logit_bias), grammar=s.grammar,
                      min_tokens=p.min_tokens, stop_token_ids=list(p.stop_token_ids)),
        features=dict(kind=int(n.kind), moa_server_part=n.moa_server_part, tli_layers=n.tli_layers),
        codec=dict(codec=int(c.codec), zstd_level=c.zstd_level, outlier_channels=c.outlier_channels),
        max_new_tokens=s.max_new_tokens, tokenizer_fingerprint=s.tokenizer_fingerprint, drafter=s.drafter,
        tree=tree, logprobs=dict(top=s.logprobs) if s.logprobs is not None else None)


def settings_of(o, session_id: str) -> SessionSettings:
    """An Open's settings (`o`: the wire's Open, or anything with its fields and ``HasField``), the session's id
    as the server settled it. Refuses bad sampling or codec settings, an unknown feature kind, and more
    alternatives than the wire sends; what the server has (its tokenizer, layers, MoA parts) it checks itself."""
    try:
        sp = o.sampling  # proto3 zeros: top_p 0 and repetition_penalty 0 mean off
        sampling = SamplingSettings(sp.temperature, sp.top_p or 1.0, sp.top_k, sp.min_p, sp.presence_penalty,
                                    sp.frequency_penalty, sp.repetition_penalty or 1.0,
                                    tuple(sp.logit_bias.items()), sp.min_tokens, tuple(sp.stop_token_ids))
    except ValueError as exc:
        raise InvalidRequestError(f"bad sampling parameters: {exc}") from None
    try:
        kind = FeatureKind(o.features.kind)
    except ValueError:
        raise InvalidRequestError(f"unknown feature kind {o.features.kind}; known: "
                                  f"{[k.value for k in FeatureKind]}") from None
    try:
        # No CodecChoice: the default frame. Proto3 zeros: codec 0 and outlier_channels 0 mean the defaults.
        codec = ActivationCodec() if not o.HasField("codec") else ActivationCodec(
            Codec(o.codec.codec or Codec.INT8_OUTLIER), o.codec.zstd_level,
            o.codec.outlier_channels or DEFAULT_OUTLIER_CHANNELS)
    except ValueError as exc:
        raise FrameError(f"bad codec choice: {exc}") from None
    logprobs = o.logprobs.top if o.HasField("logprobs") else None
    if logprobs is not None and logprobs > MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"Open.logprobs.top is {logprobs}; at most {MAX_TOP_LOGPROBS} alternatives "
                                  f"per token are sent")
    return SessionSettings(session_id, sampling, o.sampling.seed,
                           FeatureRequest(kind, o.features.moa_server_part, o.features.tli_layers),
                           o.max_new_tokens, o.drafter, logprobs, o.sampling.grammar, len(o.prompt_ids), codec,
                           o.tokenizer_fingerprint)
