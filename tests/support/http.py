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
