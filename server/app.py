"""Start a verification server: the target, the gRPC service, the HTTP side, in one process.

    with start_server(ServerConfig(model="qwen2.5-coder-1.5b-instruct")) as server:
        channel = grpc.insecure_channel(server.address)

``start_server`` returns once both ports listen and the model is loaded.
``ServerHandle.stop`` drains: no new sessions, in-flight verifications finish,
then both servers stop.
"""
from __future__ import annotations

import logging
import socket
import threading
import time

from edgespec.shared.wire import MAX_NODES

from .core import CoreLimits, VerifierCore
from .rpc.grpc_server import GrpcServer
from .server_config import ServerConfig
from .session_store import StoreLimits

log = logging.getLogger("edgespec.server")


class ServerHandle:
    """A running server. ``address`` is "host:port" of the gRPC side."""

    def __init__(self, config: ServerConfig, core: VerifierCore, grpc_server: GrpcServer, http: "_HttpThread | None"):
        self.config = config
        self.core = core
        self.port = grpc_server.port
        self.http_port: int | None = http.port if http else None
        self.address = f"{config.host}:{self.port}"
        self._grpc = grpc_server
        self._http = http
        self._stopped = threading.Event()

    @property
    def http_url(self) -> str | None:
        scheme = "https" if self.config.tls else "http"
        return None if self.http_port is None else f"{scheme}://{self.config.host}:{self.http_port}"

    def stop(self, grace: float | None = None) -> None:
        """Refuse new sessions, let in-flight calls (gRPC and HTTP alike) finish for up to `grace` seconds
        (None: the config's drain_grace_s), then stop."""
        if self._stopped.is_set():
            return
        grace = self.config.drain_grace_s if grace is None else grace
        log.info("draining: no new sessions; waiting up to %.1f s for in-flight calls", grace,
                 extra={"grace_s": grace})
        self.core.draining.set()
        started = time.monotonic()
        self._grpc.stop(grace)
        if self._http:  # it answered /health with 503 "draining" meanwhile; its requests get what is left
            self._http.stop(max(0.0, grace - (time.monotonic() - started)))
        self.core.close_all()
        self._stopped.set()
        log.info("stopped")

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(config: ServerConfig) -> ServerHandle:
    """Start HTTP (health answers 503 while loading), load the target, start gRPC; returns once both listen."""
    from edgespec.shared.models.loading import load_model

    from .architectures import adapt_for_tree_verification
    from .cost_curve import measure_cost_curve
    from .http_api import HttpState, build_http_app
    from .target import TargetModel

    state = HttpState(config.served_model_name, api_key=config.api_key, max_body_bytes=config.max_body_bytes,
                      metrics_need_key=config.metrics_need_key, allowed_origins=config.allowed_origins,
                      log_requests=config.log_requests)
    http = _HttpThread(build_http_app(state), config) if config.http_port is not None else None
    try:
        t0 = time.monotonic()
        loaded = load_model(config.model, device=config.device, dtype=config.dtype,
                            trust_remote_code=config.trust_remote_code)
        context = adapt_for_tree_verification(loaded.model, config.max_context_tokens)
        target = TargetModel(loaded)
        # What clients and dashboards see: the served name, else the model as given (vLLM's default), not the
        # folder's basename; Info's registry_name still names a registry model's tokenizer.
        target.name = config.served_model_name or config.model
        log.info("loaded target %s (%d layers, hidden %d, vocab %d) on %s in %s in %.1f s", target.name,
                 target.num_layers, target.hidden_size, target.vocab_size, target.device,
                 str(target.dtype).removeprefix("torch."), time.monotonic() - t0)
        engine = _engine(config, target, context)
        _pack_weights(config, target)  # after the engine: its fusions (if any) read the model's own modules
        core = VerifierCore(target, _limits(config, context, engine),
                            _load_lsa_parts(config, target), engine=engine)
        core.cost_curve = measure_cost_curve(core)  # Info reports it: clients size their trees from it
        grpc_server = GrpcServer(core, host=config.host, port=config.port, api_key=config.api_key,
                                 workers=config.grpc_workers or config.max_sessions + 8,
                                 max_message_bytes=config.max_message_bytes,
                                 first_message_timeout_s=config.first_message_timeout_s,
                                 keepalive_min_ping_s=config.keepalive_min_ping_s,
                                 tls=(config.tls_cert, config.tls_key) if config.tls else None)
    except BaseException:
        if http:
            http.stop()
        raise
    state.core = core
    handle = ServerHandle(config, core, grpc_server, http)
    log.info("listening grpc=%s%s%s", handle.address,
             f" http={config.host}:{handle.http_port}" if http else "", " (TLS)" if config.tls else "")
    return handle


def _pack_weights(config: ServerConfig, target) -> None:
    from edgespec.shared.packed_weights import pack_linears, packed_bytes, packed_weights_wanted

    if packed_weights_wanted(target.device, target.dtype, config.packed_weights, target.model):
        count = pack_linears(target.model)
        log.info("packed weights: %d linears reordered for oneDNN's multi-row products (%.2f GB more; "
                 "--no-packed-weights holds them once)", count, packed_bytes(target.model) / 1e9)
    elif config.packed_weights is None and packed_weights_wanted(target.device, target.dtype, None):
        log.warning("packed weights: off, as a second copy of the weights would leave less than a quarter of this "
                    "machine's memory free (trees then cost 1.5x more; --packed-weights asks for them anyway)")


def _limits(config: ServerConfig, context: int, engine) -> CoreLimits:
    return CoreLimits(max_tree_nodes=min(config.max_tree_nodes, MAX_NODES), max_context_tokens=context,
                      max_message_bytes=config.max_message_bytes, prefix_cache_bytes=config.prefix_cache_bytes,
                      store=StoreLimits(config.max_sessions, config.session_ttl_s,
                                        engine.session_kv_bytes(config.max_kv_bytes)))


def _engine(config: ServerConfig, target, context: int):
    """The engine (logged: which path runs); the batched one's KV pool is sized by --gpu-memory-utilization on a
    GPU, --max-kv-gb elsewhere (``engine.memory``)."""
    from .engine.batched import API_SEQS, PoolConfig
    from .engine.choice import build_engine
    from .engine.memory import kv_pool_bytes

    buckets = target.device.type == "cuda" if config.shape_buckets is None else config.shape_buckets
    rows = PoolConfig.max_batch_rows
    pool = PoolConfig(kv_pool_bytes(target, config.gpu_memory_utilization, config.max_kv_bytes, rows),
                      config.max_sessions + API_SEQS, context, min(config.max_tree_nodes, MAX_NODES),
                      shape_buckets=buckets, graphs=buckets and not config.enforce_eager,
                      prefix_cache_bytes=config.prefix_cache_bytes)
    return build_engine(target, config.engine, pool)


def _load_lsa_parts(config: ServerConfig, target) -> dict:
    import torch

    from edgespec.shared.drafters.moa.lsa import LayerSelfAttention, LSAConfig, open_moa_server_part

    parts = {}
    for name, path in config.moa_server_parts.items():
        module = open_moa_server_part(path, device=target.device)
        if (module.config.num_layers, module.config.kv_size) != (target.num_layers, target.kv_size):
            raise ValueError(f"MoA server part {name} ({path}) was made for {module.config.num_layers} layers of "
                             f"kv_size {module.config.kv_size}; the target has {target.num_layers} and {target.kv_size}")
        parts[name] = module
        log.info("loaded MoA server part %s from %s", name, path)
    for i, name in enumerate(config.random_moa_parts):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(i)
            module = LayerSelfAttention(LSAConfig(target.num_layers, target.kv_size))
        parts[name] = module.to(target.device).eval()
        log.info("MoA server part %s is randomly initialised (for tests)", name)
    return parts


class _HttpThread:
    """uvicorn on its own thread, on a socket bound here so port 0 resolves before it starts."""

    def __init__(self, app, config: ServerConfig):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((config.host, config.http_port or 0))
        self.port = self.sock.getsockname()[1]
        ssl = dict(ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key) if config.tls else {}
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, log_config=None,
                                                    timeout_graceful_shutdown=config.drain_grace_s, **ssl))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="edgespec-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise OSError(f"the HTTP server did not start on {config.host}:{self.port}")

    def stop(self, grace: float | None = None) -> None:
        """Stop taking connections; requests in flight get up to `grace` seconds (None: the config's drain grace),
        then are cancelled (uvicorn's graceful shutdown)."""
        if grace is not None:
            self.server.config.timeout_graceful_shutdown = grace
        self.server.should_exit = True
        self.thread.join(timeout=self.server.config.timeout_graceful_shutdown + 10)
        self.sock.close()
