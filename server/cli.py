"""`edgespec server`: run the verification server until SIGTERM/SIGINT.

    edgespec server qwen2.5-coder-1.5b-instruct --host 0.0.0.0
    edgespec server MODEL --port 8000 --grpc-port 50051
    EDGESPEC_PORT=9000 edgespec server --config server.yaml

--port is the HTTP port (the OpenAI-compatible API, /health, /metrics), as vLLM's --port is;
the gRPC Verifier listens on --grpc-port. --http-port is --port's old name and still works.
vLLM's spellings work too: a positional MODEL, --max-model-len, --ssl-certfile/--ssl-keyfile,
--served-model-name, --dtype auto, --trust-remote-code, --allowed-origins, --enable-log-requests.
"""
from __future__ import annotations

import argparse

from edgespec.shared.config import comma_list, enable_layers
from edgespec.shared.logging_setup import LEVELS

DEFAULT_GRPC_PORT = 50051
DEFAULT_HTTP_PORT = 8080  # the images, compose, k8s and the README use it; `client serve` takes 8000
DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "float32", "fp32")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("server", help="run the verification server (gRPC + HTTP)", description=__doc__)
    p.add_argument("model_positional", nargs="?", metavar="MODEL", default=None,
                   help="the target, as with --model, which it wins over (vLLM's `vllm serve MODEL`)")
    p.add_argument("--model", default=None, help="registry name or local Hugging Face directory of the target")
    p.add_argument("--served-model-name", default=None,
                   help="the model's name in the API, Info and metrics (unset: the model's own); Info still gives "
                        "a registry model's registry name, by which clients load the tokenizer")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    p.add_argument("--port", "--http-port", dest="port", type=int, default=DEFAULT_HTTP_PORT,
                   help="HTTP port, as vLLM's --port: OpenAI-compatible API, /health, /metrics (0 = pick a free one, "
                        "-1 = none); --http-port is its old name")
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT,
                   help="gRPC port of the Verifier, where clients connect (0 = pick a free one)")
    p.add_argument("--device", default=None, help="cpu, cuda:0, ... (unset: CUDA when present)")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="weights' dtype; auto = the checkpoint's own; unset: bfloat16 on a GPU or a CPU that "
                        "computes it natively (AVX512-BF16, AMX), float32 on other CPUs")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the model repository's own Python code (custom architectures)")
    p.add_argument("--max-sessions", type=int, default=64, help="sessions held at once")
    p.add_argument("--session-ttl", type=float, default=600.0, help="idle seconds before a session is dropped")
    p.add_argument("--max-kv-gb", type=float, default=8.0, help="KV memory of all sessions, GiB (LRU past it)")
    p.add_argument("--prefix-cache-gb", type=float, default=2.0,
                   help="KV of finished sessions and plain-API requests kept for prompts that start the same way "
                        "(a chat's next turn prefills only its new tokens), GiB, LRU past it; 0 = off (vLLM's "
                        "automatic prefix caching)")
    p.add_argument("--engine", choices=["auto", "batched", "generic"], default="auto",
                   help="batched: KV pool, one forward for all sessions; generic: a DynamicCache per session; "
                        "auto: batched on a GPU for full-attention models, else generic")
    p.add_argument("--shape-buckets", action=argparse.BooleanOptionalAction, default=None,
                   help="batched engine: pad batches to a grid of static shapes, each captured once as a CUDA graph "
                        "(unset: on for a CUDA device, off elsewhere)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="batched engine: capture no CUDA graphs; run every step eagerly (as vLLM's flag)")
    p.add_argument("--max-context", "--max-model-len", type=int, default=0,
                   help="tokens per session (0 = the model's limit)")
    p.add_argument("--tls-cert", "--ssl-certfile", default=None,
                   help="PEM certificate chain (with --tls-key: TLS on both ports)")
    p.add_argument("--tls-key", "--ssl-keyfile", default=None, help="PEM private key")
    p.add_argument("--api-key", default=None, help="require this key in gRPC metadata and HTTP Authorization "
                                                   "(EDGESPEC_API_KEY keeps it out of the process list)")
    p.add_argument("--metrics-need-key", action="store_true", help="/metrics asks for --api-key too")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="largest HTTP request body, MiB (413 past it)")
    p.add_argument("--first-message-timeout", type=float, default=5.0,
                   help="seconds a new Session stream may stay silent before it is closed")
    p.add_argument("--moa-server-part", action="append", default=[], metavar="NAME[=PATH]",
                   help="load a MoA server part: a shipped checkpoint's name (moa-tli0), or NAME=PATH of a "
                        "server.safetensors file or MoA checkpoint folder; repeatable")
    p.add_argument("--random-moa-part", action="append", default=[], metavar="NAME",
                   help="add a randomly initialised MoA server part (for tests and demos); repeatable")
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="log lines as text or one JSON object a line (no progress bars) on stderr")
    p.add_argument("--log-level", choices=LEVELS, default="info", help="least severe level logged")
    p.add_argument("--drain-grace", type=float, default=10.0,
                   help="seconds in-flight gRPC calls and HTTP requests get on shutdown")
    p.add_argument("--allowed-origins", action="append", default=[], metavar="ORIGIN[,ORIGIN]",
                   help="CORS: origins browser pages may call the HTTP API from (https://app.example, or * for any); "
                        "repeatable or comma-separated; unset: no cross-origin calls")
    p.add_argument("--enable-log-requests", action="store_true",
                   help="log every plain-API request as it is accepted: id, sizes, sampling (never the prompt's text)")
    p.set_defaults(func=run)
    enable_layers(p)


def _parts(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:  # a shipped checkpoint's name stands for itself
            name, path = spec, spec
        if not name or not path:
            raise SystemExit(f"--moa-server-part wants NAME=PATH or a shipped checkpoint's name, got {spec!r}")
        out[name] = path
    return out


def model_of(args: argparse.Namespace) -> str:
    """The target: `server MODEL` wins over --model (which may come from EDGESPEC_MODEL or the config file)."""
    model = args.model_positional or args.model
    if not model:
        raise SystemExit("no model: `edgespec server MODEL`, --model, EDGESPEC_MODEL or `model:` in --config")
    return model


def http_port_of(args: argparse.Namespace) -> int:
    """The HTTP port (--port, vLLM's meaning). `--port 50051` with gRPC on its default is the old spelling, when
    --port was the gRPC port: both would take 50051, so it is refused with the new spelling."""
    if args.port == DEFAULT_GRPC_PORT and args.grpc_port == DEFAULT_GRPC_PORT:
        raise SystemExit(f"--port {args.port}: --port is the HTTP port now, as vLLM's, and {DEFAULT_GRPC_PORT} is "
                         f"the gRPC port (--grpc-port); for gRPC on {args.port} write --grpc-port {args.port} "
                         f"(HTTP stays on {DEFAULT_HTTP_PORT}, or give it as --port)")
    return args.port


def server_config(args: argparse.Namespace):
    """ServerConfig from parsed arguments."""
    from .app import ServerConfig

    if args.first_message_timeout <= 0:
        raise SystemExit("--first-message-timeout must be above 0 seconds (a stream needs time to send Open)")
    if args.prefix_cache_gb < 0:
        raise SystemExit(f"--prefix-cache-gb must be 0 (off) or more, got {args.prefix_cache_gb:g}")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together (--ssl-certfile and --ssl-keyfile)")
    http_port = http_port_of(args)
    return ServerConfig(
        model=model_of(args), served_model_name=args.served_model_name, host=args.host, port=args.grpc_port,
        http_port=None if http_port < 0 else http_port, device=args.device, dtype=args.dtype,
        trust_remote_code=args.trust_remote_code, max_sessions=args.max_sessions, session_ttl_s=args.session_ttl,
        max_kv_bytes=int(args.max_kv_gb * (1 << 30)), prefix_cache_bytes=int(args.prefix_cache_gb * (1 << 30)),
        max_context_tokens=args.max_context, engine=args.engine,
        shape_buckets=args.shape_buckets, enforce_eager=args.enforce_eager,
        tls_cert=args.tls_cert, tls_key=args.tls_key, api_key=args.api_key,
        moa_server_parts=_parts(args.moa_server_part), random_moa_parts=tuple(args.random_moa_part),
        metrics_need_key=args.metrics_need_key, max_body_bytes=int(args.max_body_mb * (1 << 20)),
        first_message_timeout_s=args.first_message_timeout, allowed_origins=comma_list(args.allowed_origins),
        log_requests=args.enable_log_requests, drain_grace_s=args.drain_grace)


def run(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .app import start_server

    config = server_config(args)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    handle = start_server(config)
    http = f"{config.host}:{handle.http_port}" if handle.http_port is not None else "none"
    print(f"edgespec server listening grpc={handle.address} http={http}", flush=True)
    while not stop.wait(0.5):
        pass
    handle.stop()  # --drain-grace, on both sides
    return 0
