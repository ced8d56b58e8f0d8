from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FeatureKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FEATURE_KIND_NONE: _ClassVar[FeatureKind]
    FEATURE_KIND_LAST_HIDDEN: _ClassVar[FeatureKind]
    FEATURE_KIND_MOA: _ClassVar[FeatureKind]

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_FP16: _ClassVar[Codec]
    CODEC_INT8: _ClassVar[Codec]
    CODEC_INT8_OUTLIER: _ClassVar[Codec]

class ResumePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESUME_POLICY_KEEP: _ClassVar[ResumePolicy]
    RESUME_POLICY_ROLLBACK: _ClassVar[ResumePolicy]
FEATURE_KIND_NONE: FeatureKind
FEATURE_KIND_LAST_HIDDEN: FeatureKind
FEATURE_KIND_MOA: FeatureKind
CODEC_UNSPECIFIED: Codec
CODEC_FP16: Codec
CODEC_INT8: Codec
CODEC_INT8_OUTLIER: Codec
RESUME_POLICY_KEEP: ResumePolicy
RESUME_POLICY_ROLLBACK: ResumePolicy

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_name", "vocab_size", "tokenizer_fingerprint", "hidden_size", "num_layers", "num_kv_heads", "head_dim", "kv_size", "feature_kinds", "codecs", "limits", "server_version", "device", "dtype", "moa_server_parts", "eos_token_ids", "registry_name", "verify_cost_nodes", "verify_cost_ns", "verify_cost_context")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    KV_SIZE_FIELD_NUMBER: _ClassVar[int]
    FEATURE_KINDS_FIELD_NUMBER: _ClassVar[int]
    CODECS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MOA_SERVER_PARTS_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_NAME_FIELD_NUMBER: _ClassVar[int]
    VERIFY_COST_NODES_FIELD_NUMBER: _ClassVar[int]
    VERIFY_COST_NS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_COST_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    vocab_size: int
    tokenizer_fingerprint: str
    hidden_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_size: int
    feature_kinds: _containers.RepeatedScalarFieldContainer[FeatureKind]
    codecs: _containers.RepeatedScalarFieldContainer[Codec]
    limits: ServerLimits
    server_version: str
    device: str
    dtype: str
    moa_server_parts: _containers.RepeatedScalarFieldContainer[str]
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    registry_name: str
    verify_cost_nodes: _containers.RepeatedScalarFieldContainer[int]
    verify_cost_ns: _containers.RepeatedScalarFieldContainer[int]
    verify_cost_context: int
    def __init__(self, model_name: _Optional[str] = ..., vocab_size: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., hidden_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., kv_size: _Optional[int] = ..., feature_kinds: _Optional[_Iterable[_Union[FeatureKind, str]]] = ..., codecs: _Optional[_Iterable[_Union[Codec, str]]] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., server_version: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., moa_server_parts: _Optional[_Iterable[str]] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., registry_name: _Optional[str] = ..., verify_cost_nodes: _Optional[_Iterable[int]] = ..., verify_cost_ns: _Optional[_Iterable[int]] = ..., verify_cost_context: _Optional[int] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_tree_nodes", "max_context_tokens", "max_sessions", "max_message_bytes", "session_ttl_s")
    MAX_TREE_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_TTL_S_FIELD_NUMBER: _ClassVar[int]
    max_tree_nodes: int
    max_context_tokens: int
    max_sessions: int
    max_message_bytes: int
    session_ttl_s: int
    def __init__(self, max_tree_nodes: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., max_sessions: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., session_ttl_s: _Optional[int] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ("open", "draft", "resume", "close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: Open
    draft: Draft
    resume: Resume
    close: Close
    def __init__(self, open: _Optional[_Union[Open, _Mapping]] = ..., draft: _Optional[_Union[Draft, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., close: _Optional[_Union[Close, _Mapping]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("opened", "verified", "resumed", "closed")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    opened: Opened
    verified: Verified
    resumed: Resumed
    closed: Closed
    def __init__(self, opened: _Optional[_Union[Opened, _Mapping]] = ..., verified: _Optional[_Union[Verified, _Mapping]] = ..., resumed: _Optional[_Union[Resumed, _Mapping]] = ..., closed: _Optional[_Union[Closed, _Mapping]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "grammar", "min_tokens", "stop_token_ids")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    grammar: str
    min_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., grammar: _Optional[str] = ..., min_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class FeatureRequest(_message.Message):
    __slots__ = ("kind", "moa_server_part", "tli_layers")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MOA_SERVER_PART_FIELD_NUMBER: _ClassVar[int]
    TLI_LAYERS_FIELD_NUMBER: _ClassVar[int]
    kind: FeatureKind
    moa_server_part: str
    tli_layers: int
    def __init__(self, kind: _Optional[_Union[FeatureKind, str]] = ..., moa_server_part: _Optional[str] = ..., tli_layers: _Optional[int] = ...) -> None: ...

class CodecChoice(_message.Message):
    __slots__ = ("codec", "zstd_level", "outlier_channels")
    CODEC_FIELD_NUMBER: _ClassVar[int]
    ZSTD_LEVEL_FIELD_NUMBER: _ClassVar[int]
    OUTLIER_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    codec: Codec
    zstd_level: int
    outlier_channels: int
    def __init__(self, codec: _Optional[_Union[Codec, str]] = ..., zstd_level: _Optional[int] = ..., outlier_channels: _Optional[int] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("session_id", "prompt_ids", "sampling", "features", "codec", "max_new_tokens", "tokenizer_fingerprint", "drafter", "tree", "logprobs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    features: FeatureRequest
    codec: CodecChoice
    max_new_tokens: int
    tokenizer_fingerprint: str
    drafter: str
    tree: bytes
    logprobs: LogprobRequest
    def __init__(self, session_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., features: _Optional[_Union[FeatureRequest, _Mapping]] = ..., codec: _Optional[_Union[CodecChoice, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., drafter: _Optional[str] = ..., tree: _Optional[bytes] = ..., logprobs: _Optional[_Union[LogprobRequest, _Mapping]] = ...) -> None: ...

class LogprobRequest(_message.Message):
    __slots__ = ("top",)
    TOP_FIELD_NUMBER: _ClassVar[int]
    top: int
    def __init__(self, top: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Opened(_message.Message):
    __slots__ = ("session_id", "first_token", "committed_len", "features", "timings", "accepted", "logprobs", "cached_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    first_token: int
    committed_len: int
    features: _containers.RepeatedCompositeFieldContainer[Feature]
    timings: Timings
    accepted: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    cached_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., first_token: _Optional[int] = ..., committed_len: _Optional[int] = ..., features: _Optional[_Iterable[_Union[Feature, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., accepted: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class Draft(_message.Message):
    __slots__ = ("session_id", "step", "committed_len", "tree", "decode_ahead", "queued")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    DECODE_AHEAD_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    committed_len: int
    tree: bytes
    decode_ahead: int
    queued: bool
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., committed_len: _Optional[int] = ..., tree: _Optional[bytes] = ..., decode_ahead: _Optional[int] = ..., queued: _Optional[bool] = ...) -> None: ...

class Verified(_message.Message):
    __slots__ = ("session_id", "step", "accepted", "bonus_token", "committed_len", "features", "timings", "logprobs", "decoded", "skipped")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    DECODED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    accepted: _containers.RepeatedScalarFieldContainer[int]
    bonus_token: int
    committed_len: int
    features: _containers.RepeatedCompositeFieldContainer[Feature]
    timings: Timings
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    decoded: _containers.RepeatedScalarFieldContainer[int]
    skipped: bool
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., accepted: _Optional[_Iterable[int]] = ..., bonus_token: _Optional[int] = ..., committed_len: _Optional[int] = ..., features: _Optional[_Iterable[_Union[Feature, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., decoded: _Optional[_Iterable[int]] = ..., skipped: _Optional[bool] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ("session_id", "committed_len", "committed_hash", "committed_ids", "provisional_ids", "policy", "reopen", "step")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_HASH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_IDS_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REOPEN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    committed_len: int
    committed_hash: bytes
    committed_ids: _containers.RepeatedScalarFieldContainer[int]
    provisional_ids: _containers.RepeatedScalarFieldContainer[int]
    policy: ResumePolicy
    reopen: Open
    step: int
    def __init__(self, session_id: _Optional[str] = ..., committed_len: _Optional[int] = ..., committed_hash: _Optional[bytes] = ..., committed_ids: _Optional[_Iterable[int]] = ..., provisional_ids: _Optional[_Iterable[int]] = ..., policy: _Optional[_Union[ResumePolicy, str]] = ..., reopen: _Optional[_Union[Open, _Mapping]] = ..., step: _Optional[int] = ...) -> None: ...

class Resumed(_message.Message):
    __slots__ = ("session_id", "agreed", "restored", "bonus_token", "committed_len", "features", "timings", "logprobs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGREED_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    agreed: int
    restored: bool
    bonus_token: int
    committed_len: int
    features: _containers.RepeatedCompositeFieldContainer[Feature]
    timings: Timings
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, session_id: _Optional[str] = ..., agreed: _Optional[int] = ..., restored: _Optional[bool] = ..., bonus_token: _Optional[int] = ..., committed_len: _Optional[int] = ..., features: _Optional[_Iterable[_Union[Feature, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class Close(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class Closed(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class Feature(_message.Message):
    __slots__ = ("name", "frame")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    frame: bytes
    def __init__(self, name: _Optional[str] = ..., frame: _Optional[bytes] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ns", "forward_ns", "verify_ns", "encode_ns", "total_ns", "row_cost_ns", "sharing")
    QUEUE_NS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_NS_FIELD_NUMBER: _ClassVar[int]
    ENCODE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    ROW_COST_NS_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    queue_ns: int
    forward_ns: int
    verify_ns: int
    encode_ns: int
    total_ns: int
    row_cost_ns: int
    sharing: float
    def __init__(self, queue_ns: _Optional[int] = ..., forward_ns: _Optional[int] = ..., verify_ns: _Optional[int] = ..., encode_ns: _Optional[int] = ..., total_ns: _Optional[int] = ..., row_cost_ns: _Optional[int] = ..., sharing: _Optional[float] = ...) -> None: ...
