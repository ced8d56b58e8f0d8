"""`edgespec server`: run the verification server until SIGTERM/SIGINT.

    edgespec server qwen2.5-coder-1.5b-instruct --host 0.0.0.0
    edgespec server MODEL --port 8000 --grpc-port 50051
    EDGESPEC_PORT=9000 edgespec server --config server.yaml

--port is the HTTP port (the OpenAI-compatible API, /health, /metrics), as vLLM's --port is;
the gRPC Verifier listens on --grpc-port. --http-port is --port's old name; the old pair
`--port G --http-port H` (gRPC on G) is refused with its new spelling, `--grpc-port G --port H`.
vLLM's spellings work too: a positional MODEL, --max-model-len, --ssl-certfile/--ssl-keyfile,
--served-model-name, --dtype auto, --trust-remote-code, --allowed-origins, --enable-log-requests.
"""
from __future__ import annotations

import argparse

from edgespec.shared import defaults
from edgespec.shared.config import comma_list, enable_layers
from edgespec.shared.config_flags import Flag, add_flags, from_args
from edgespec.shared.logging_setup import LEVELS

from .server_config import ServerConfig

DEFAULT_GRPC_PORT = defaults.GRPC_PORT
DEFAULT_HTTP_PORT = defaults.HTTP_PORT  # the images, compose, k8s and the docs use it; `client serve` takes 8000


class HttpPortStore(argparse._StoreAction):
    """--port's store, remembering the spellings given (--port, or its old name --http-port): the old command line
    `--port G --http-port H` meant gRPC on G, and is refused rather than read as HTTP on H."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.http_port_spellings = {**(getattr(namespace, "http_port_spellings", None) or {}),
                                         option_string: values}
        super().__call__(parser, namespace, values, option_string)


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


# ServerConfig's fields on the command line, in --help's order; the rest (max_tree_nodes, grpc_workers, ...) are
# the library's. Type, default and help come from the field where the Flag does not say otherwise.
FLAGS = {
    "model": Flag(), "served_model_name": Flag(), "host": Flag(),
    # --port is vLLM's meaning (HTTP); the library's `port` is gRPC.
    "http_port": Flag("--port", "--http-port", default=DEFAULT_HTTP_PORT,
                      help="HTTP port, as vLLM's --port: OpenAI-compatible API, /health, /metrics (0 = pick a free "
                           "one, -1 = none); --http-port is its old name", action=HttpPortStore),
    "port": Flag("--grpc-port", default=DEFAULT_GRPC_PORT),
    "device": Flag(), "dtype": Flag(), "trust_remote_code": Flag(), "max_sessions": Flag(), "session_ttl_s": Flag(),
    "max_kv_bytes": Flag(unit="GiB"), "gpu_memory_utilization": Flag(), "prefix_cache_bytes": Flag(unit="GiB"),
    "engine": Flag(),
    "shape_buckets": Flag(), "enforce_eager": Flag(), "packed_weights": Flag(),
    "max_context_tokens": Flag("--max-context", "--max-model-len"),
    "tls_cert": Flag("--tls-cert", "--ssl-certfile"), "tls_key": Flag("--tls-key", "--ssl-keyfile"),
    "api_key": Flag(help="require this key in gRPC metadata and HTTP Authorization (EDGESPEC_API_KEY keeps it out "
                         "of the process list)"),
    "metrics_need_key": Flag(),
    "max_body_bytes": Flag(unit="MiB"), "first_message_timeout_s": Flag(),
    "moa_server_parts": Flag("--moa-server-part", action="append", metavar="NAME[=PATH]", convert=_parts,
                             help="load a MoA server part: a shipped checkpoint's name (moa-tli0), or NAME=PATH of a "
                                  "server.safetensors file or MoA checkpoint folder; repeatable"),
    "random_moa_parts": Flag("--random-moa-part", metavar="NAME"),
    "drain_grace_s": Flag(),
    "allowed_origins": Flag(metavar="ORIGIN[,ORIGIN]", convert=comma_list,
                            help="CORS: origins browser pages may call the HTTP API from (https://app.example, or * "
                                 "for any); repeatable or comma-separated; unset: no cross-origin calls"),
    "log_requests": Flag("--enable-log-requests"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("server", help="run the verification server (gRPC + HTTP)", description=__doc__)
    p.add_argument("model_positional", nargs="?", metavar="MODEL", default=None,
                   help="the target, as with --model, which it wins over (vLLM's `vllm serve MODEL`)")
    add_flags(p, ServerConfig, FLAGS)
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="log lines as text or one JSON object a line (no progress bars) on stderr")
    p.add_argument("--log-level", choices=LEVELS, default="info", help="least severe level logged")
    p.set_defaults(func=run)
    enable_layers(p)


def model_of(args: argparse.Namespace) -> str:
    """The target: `server MODEL` wins over --model (which may come from EDGESPEC_MODEL or the config file)."""
    model = args.model_positional or args.model
    if not model:
        raise SystemExit("no model: `edgespec server MODEL`, --model, EDGESPEC_MODEL or `model:` in --config")
    return model


def http_port_of(args: argparse.Namespace) -> int:
    """The HTTP port (--port, vLLM's meaning). `--port 50051` with gRPC on its default is the old spelling, when
    --port was the gRPC port: both would take 50051, so it is refused with the new spelling."""
    given = getattr(args, "http_port_spellings", None) or {}
    if "--port" in given and "--http-port" in given and args.grpc_port != DEFAULT_GRPC_PORT:
        # gRPC has its own flag here, so neither is an old gRPC port: the advice below would drop --grpc-port's
        raise SystemExit(f"--port {given['--port']} --http-port {given['--http-port']}: --http-port is --port's old "
                         f"name, so the two name one port, the HTTP port; give it once, as --port (gRPC stays on "
                         f"--grpc-port {args.grpc_port})")
    if "--port" in given and "--http-port" in given:
        raise SystemExit(f"--port {given['--port']} --http-port {given['--http-port']}: the old spelling, when --port "
                         f"was the gRPC port; --port is the HTTP port now, as vLLM's, and --http-port its old name, "
                         f"so the two name one port. Write --grpc-port {given['--port']} --port {given['--http-port']}")
    if args.port == DEFAULT_GRPC_PORT and args.grpc_port == DEFAULT_GRPC_PORT:
        raise SystemExit(f"--port {args.port}: --port is the HTTP port now, as vLLM's, and {DEFAULT_GRPC_PORT} is "
                         f"the gRPC port (--grpc-port); for gRPC on {args.port} write --grpc-port {args.port} "
                         f"(HTTP stays on {DEFAULT_HTTP_PORT}, or give it as --port)")
    if args.port > 0 and args.port == args.grpc_port:
        raise SystemExit(f"--port {args.port} and --grpc-port {args.grpc_port}: the HTTP API and gRPC cannot share "
                         f"one port; give each its own")
    return args.port


def server_config(args: argparse.Namespace):
    """ServerConfig from parsed arguments."""
    if args.first_message_timeout <= 0:
        raise SystemExit("--first-message-timeout must be above 0 seconds (a stream needs time to send Open)")
    if args.prefix_cache_gb < 0:
        raise SystemExit(f"--prefix-cache-gb must be 0 (off) or more, got {args.prefix_cache_gb:g}")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise SystemExit(f"--gpu-memory-utilization is a share of the GPU's memory, above 0 and at most 1, got "
                         f"{args.gpu_memory_utilization:g}")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together (--ssl-certfile and --ssl-keyfile)")
    http_port = http_port_of(args)
    return from_args(ServerConfig, args, FLAGS, model=model_of(args), http_port=None if http_port < 0 else http_port)


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
