"""ServerConfig: what `start_server` (``app.py``) runs. Each field's comment is also its flag's help in
`edgespec server --help` (``cli.py`` makes the flags from these fields), so this module imports nothing
heavy: the command's help needs it without torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from edgespec.shared import defaults
from edgespec.shared.wire import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_MESSAGE_BYTES, MAX_NODES

# The weights' dtype by name: "auto" is the fast one on the device (bf16 on a GPU or a CPU that computes it natively,
# else float32), "checkpoint" the checkpoint's own; the short names are aliases.
Dtype = Literal["auto", "checkpoint", "bfloat16", "bf16", "float16", "fp16", "float32", "fp32"]
EngineKind = Literal["auto", "batched", "generic"]


@dataclass
class ServerConfig:
    model: str  # registry name or local Hugging Face directory of the target
    host: str = "127.0.0.1"  # interface to bind (0.0.0.0 for all)
    port: int = 0  # gRPC port of the Verifier, where clients connect (0 = pick a free one)
    http_port: int | None = 0  # HTTP port: OpenAI-compatible API, /health, /metrics (0 = pick a free one, None =
    # no HTTP)
    device: str | None = None  # cpu, cuda:0, ... (unset: CUDA when present)
    dtype: Dtype = defaults.DTYPE  # weights' dtype; auto: bfloat16 on a GPU or a CPU that computes it natively
    # (AVX512-BF16, AMX), float32 on other CPUs; checkpoint: the checkpoint's own
    trust_remote_code: bool = False  # run the model repository's own Python code (custom architectures)
    served_model_name: str | None = None  # the model's name in the API, Info and metrics (unset: the model's own);
    # Info still gives a registry model's registry name, by which clients load the tokenizer
    max_sessions: int = 64  # sessions held at once; Open past it gets RESOURCE_EXHAUSTED
    session_ttl_s: float = 600.0  # idle seconds before a session is dropped
    max_kv_bytes: int = 8 << 30  # KV memory of all sessions (the batched engine's pool off a GPU); least recently
    # used go first past it
    gpu_memory_utilization: float = 0.9  # batched engine on a GPU: share of the device's memory the server may
    # use, weights and the step's workspace included; the rest of that share is the KV pool (vLLM's meaning)
    prefix_cache_bytes: int = 2 << 30  # KV of finished sessions and plain-API requests kept for prompts that start
    # the same way (a chat's next turn prefills only its new tokens), LRU past it; 0 = off (vLLM's automatic prefix
    # caching)
    engine: EngineKind = "auto"  # batched: KV pool, one forward for all sessions; generic: a DynamicCache per
    # session; auto: batched on a GPU for full-attention models, else generic
    shape_buckets: bool | None = None  # batched engine: pad batches to a grid of static shapes, each captured once
    # as a CUDA graph (unset: on for a CUDA device, off elsewhere, where the padding costs compute)
    enforce_eager: bool = False  # batched engine: capture no CUDA graphs; run every step eagerly (as vLLM's flag)
    packed_weights: bool | None = None  # CPU: also hold each linear's weight reordered once for oneDNN, so a
    # tree's or a prompt's rows cost nearly what one row does (one-row decoding keeps torch's kernel; the weights
    # are held twice); unset: on for float32 on a CPU where the copy leaves a quarter of the memory free
    max_tree_nodes: int = MAX_NODES  # most nodes per draft tree
    max_context_tokens: int = 0  # tokens per session (0 = the model's limit, at most 32768)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # gRPC message size limit, both directions
    tls_cert: str | None = None  # PEM certificate chain (with its private key: TLS on both ports)
    tls_key: str | None = None  # PEM private key
    api_key: str | None = None  # require this key in gRPC metadata and HTTP Authorization
    moa_server_parts: dict[str, str] = field(default_factory=dict)  # name -> safetensors path of an LSA module
    random_moa_parts: tuple[str, ...] = ()  # randomly initialised MoA server parts (for tests and demos)
    grpc_workers: int = 0  # threads running Session messages' work (a message holds one until answered; idle
    # streams and Info hold none); 0 = max_sessions + 8
    first_message_timeout_s: float = 5.0  # seconds a new Session stream may stay silent (no Open or Resume) before
    # it is closed with DEADLINE_EXCEEDED, so silent streams cannot pile up on the server
    keepalive_min_ping_s: float = 1.0  # clients may ping this often without data (they ping every 2 s)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # largest HTTP request body (413 past it, before it is read)
    metrics_need_key: bool = False  # /metrics asks for the API key too (it names the model and the load)
    allowed_origins: tuple[str, ...] = ()  # CORS: origins browser pages may call the HTTP API from ("*": any)
    log_requests: bool = False  # log every plain-API request as it is accepted: id, sizes, sampling (never the
    # prompt's text)
    drain_grace_s: float = 10.0  # seconds in-flight gRPC calls and HTTP requests get on shutdown

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert and self.tls_key)
