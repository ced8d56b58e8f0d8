"""`edgespec server`: run the verification server until SIGTERM/SIGINT."""
from __future__ import annotations

import argparse
import os
import json
import logging
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("server", help="run the verification server (gRPC + HTTP)",
                       description="Serve a target model: gRPC verification sessions, /health, /metrics, "
                                   "and an OpenAI-compatible plain API on the HTTP port.")
    p.add_argument("--model", required=True, help="registry name or local Hugging Face directory of the target")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=50051, help="gRPC port (0 = pick a free one)")
    p.add_argument("--http-port", type=int, default=8000, help="HTTP port (0 = pick a free one, -1 = none)")
    p.add_argument("--device", default=None, help="cpu, cuda:0, ... (default: CUDA when present)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default), float16, float32")
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--session-ttl", type=float, default=600.0, help="idle seconds before a session is dropped")
    p.add_argument("--max-kv-gb", type=float, default=8.0, help="KV memory of all sessions, GiB (LRU past it)")
    p.add_argument("--max-context", type=int, default=0, help="tokens per session (0 = the model's limit)")
    p.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key: TLS on both ports)")
    p.add_argument("--tls-key", help="PEM private key")
    p.add_argument("--api-key", help="require this key in gRPC metadata and HTTP Authorization "
                                     "(default: $EDGESPEC_API_KEY, which keeps it out of the process list)")
    p.add_argument("--moa-server-part", action="append", default=[], metavar="NAME[=PATH]",
                   help="load a MoA server part: a shipped checkpoint's name (moa-tli0), or NAME=PATH of a "
                        "server.safetensors file or MoA checkpoint folder; repeatable")
    p.add_argument("--random-moa-part", action="append", default=[], metavar="NAME",
                   help="add a randomly initialised MoA server part (for tests and demos); repeatable")
    p.add_argument("--log-format", choices=["text", "json"], default="text")
    p.add_argument("--drain-grace", type=float, default=10.0, help="seconds in-flight calls get on shutdown")
    p.set_defaults(func=run)


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                 "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(fmt: str) -> None:
    if fmt != "json":
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]


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


def run(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .app import ServerConfig, start_server

    configure_logging(args.log_format)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together")
    config = ServerConfig(
        model=args.model, host=args.host, port=args.port, http_port=None if args.http_port < 0 else args.http_port,
        device=args.device, dtype=args.dtype, max_sessions=args.max_sessions, session_ttl_s=args.session_ttl,
        max_kv_bytes=int(args.max_kv_gb * (1 << 30)), max_context_tokens=args.max_context,
        tls_cert=args.tls_cert, tls_key=args.tls_key, api_key=args.api_key or os.environ.get("EDGESPEC_API_KEY"),
        moa_server_parts=_parts(args.moa_server_part), random_moa_parts=tuple(args.random_moa_part))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    handle = start_server(config)
    http = f"{config.host}:{handle.http_port}" if handle.http_port is not None else "none"
    print(f"edgespec server listening grpc={handle.address} http={http}", flush=True)
    while not stop.wait(0.5):
        pass
    handle.stop(grace=args.drain_grace)
    return 0
