"""The gRPC side of the server: an asyncio gRPC server (grpc.aio) on its own event-loop thread.

Why asyncio and not grpc's thread-per-call server: there, every open Session stream holds a worker thread
for its whole life, even before it sends anything, so a handful of silent streams took every worker and
Info (and every new session) queued behind them. Here a stream waiting for its next message is a suspended
coroutine that holds no thread, Info is answered on the event loop at once, and only the work of one
message (waiting for the model thread, encoding features) runs on a bounded thread pool, for as long as
that message takes. Admission: a stream that sends no first message within ``first_message_timeout_s`` is
closed (see ``VerifierServicer.Session``), so silent streams cannot pile up either.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from edgespec.server.core import VerifierCore
from edgespec.shared.wire import session_message_bytes

from .service import VerifierServicer, add_to_server

log = logging.getLogger("edgespec.server")


class GrpcServer:
    """A started gRPC server; ``port`` is the one it listens on (`port` 0: a free one). The settings are
    ``ServerConfig``'s of the same names (``app`` passes them): workers are the threads running messages' work,
    tls a (certificate chain, private key) pair of PEM paths."""

    def __init__(self, core: VerifierCore, *, host: str, port: int, workers: int, api_key: str | None,
                 max_message_bytes: int, first_message_timeout_s: float, keepalive_min_ping_s: float,
                 tls: tuple[str, str] | None = None):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgespec-grpc")
        self._servicer = VerifierServicer(core, api_key, self._pool, first_message_timeout_s)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edgespec-grpc-loop", daemon=True)
        self._thread.start()
        # Requests (Info's is empty; Session's are ClientMessages) are bounded by what a session can send.
        self.max_receive_bytes = min(max_message_bytes, session_message_bytes(
            core.limits.max_context_tokens, core.limits.max_tree_nodes))
        try:
            self._server, self.port = self._on_loop(self._start(f"{host}:{port}", max_message_bytes,
                                                                keepalive_min_ping_s, tls))
        except BaseException:
            self._end_loop()
            raise

    async def _start(self, where: str, max_message_bytes: int, keepalive_min_ping_s: float,
                     tls: tuple[str, str] | None) -> tuple[grpc.aio.Server, int]:
        ping_ms = int(keepalive_min_ping_s * 1000)
        options = [
            ("grpc.max_receive_message_length", self.max_receive_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # Clients ping every few seconds to notice a dead link; allow it, even with no call open.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", ping_ms),
            ("grpc.http2.min_ping_interval_without_data_ms", ping_ms),
            ("grpc.http2.max_pings_without_data", 0),
            # The server pings too, so a client that vanished (blackhole) frees its stream.
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            # gRPC binds with SO_REUSEPORT on Linux: a second server on a busy port would start without a word and
            # share the first one's calls. One server a port: the bind fails instead.
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(options=options)
        add_to_server(self._servicer, server)
        if tls:
            cert, key = tls
            creds = grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())])
            port = server.add_secure_port(where, creds)
        else:
            try:
                port = server.add_insecure_port(where)
            except RuntimeError:  # grpcio raises where it once returned 0
                port = 0
        if port == 0:
            raise OSError(f"could not listen for gRPC on {where} (port in use?)")
        await server.start()
        return server, port

    def stop(self, grace: float) -> None:
        """Refuse new calls, give calls in flight up to `grace` seconds, then end the loop and the pool."""
        try:
            self._on_loop(self._server.stop(grace), timeout=grace + 30)
        finally:
            self._end_loop()

    def _on_loop(self, coroutine, timeout: float | None = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
