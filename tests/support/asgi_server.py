"""An ASGI app served by uvicorn on a loopback port of its own, for as long as a with-block lasts."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator


@contextlib.contextmanager
def serving(app, log_level: str = "warning") -> Iterator[str]:
    """Yields the app's base URL (http://127.0.0.1:PORT) once uvicorn listens; stops it afterwards."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound before uvicorn starts, so the port is known and cannot be taken
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def slowed_calls(monkeypatch, owner, name: str, delay_s: float) -> list[int]:
    """Patch `owner.name` to sleep `delay_s` before each call, so that a generation is still under way when its
    caller leaves; returns the list each call appends to."""
    calls: list[int] = []
    original = getattr(owner, name)

    def slow(*args, **kwargs):
        calls.append(1)
        time.sleep(delay_s)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, slow)
    return calls


def assert_calls_stopped(calls: list) -> int:
    """Once the caller has left: no call comes in a second, half a second on. Returns how many came before."""
    time.sleep(0.5)
    seen = len(calls)
    time.sleep(0.5)
    assert len(calls) == seen, "the generation kept running after its caller left"
    return seen
