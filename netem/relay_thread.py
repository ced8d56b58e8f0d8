"""RelayThread: the asyncio Relay on its own thread, for code that is not async.

    with RelayThread(load_profile("4g"), upstream=("127.0.0.1", port), seed=1) as relay:
        channel = grpc.insecure_channel(f"127.0.0.1:{relay.port}")
        ...
        relay.cut("blackhole"); relay.restore(); relay.cut_after_bytes(4096, mode="reset")
        relay.stats()

Every control call runs on the relay's loop and returns once it has taken effect.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .profile import NetworkProfile
from .relay import Relay, RelayConfig, RelayStats


class RelayThread:
    def __init__(self, profile: NetworkProfile, upstream: tuple[str, int],
                 listen: tuple[str, int] = ("127.0.0.1", 0), seed: int | None = None,
                 config: RelayConfig | None = None, run_schedule: bool = True):
        self.relay = Relay(profile, upstream, listen=listen, seed=seed, config=config,
                           run_schedule=run_schedule)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def start(self) -> "RelayThread":
        ready = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
            try:
                await self.relay.start()
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                return
            finally:
                ready.set()
            await self._stopped.wait()
            await self.relay.stop()

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), name=f"relay-{self.relay.profile.name}",
                                        daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        assert self._loop is not None and self._stopped is not None
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=10)

    def __enter__(self) -> "RelayThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._loop is not None, "relay thread not started"

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    @property
    def address(self) -> tuple[str, int]:
        return self.relay.address

    @property
    def port(self) -> int:
        return self.relay.port

    @property
    def target(self) -> str:
        """"host:port" for a gRPC channel."""
        host, port = self.address
        return f"{host}:{port}"

    @property
    def state(self) -> str:
        return self.relay.state

    def cut(self, mode: str = "blackhole") -> None:
        self._call(self.relay.cut, mode)

    def restore(self) -> None:
        self._call(self.relay.restore)

    def cut_after_bytes(self, n: int, mode: str = "blackhole", direction: str = "down") -> None:
        self._call(self.relay.cut_after_bytes, n, mode, direction)

    def stats(self) -> RelayStats:
        return self._call(self.relay.stats)
