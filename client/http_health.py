"""What the local API's /health reports: is the client loaded, and is its link to the server up.

``ClientSlot`` holds the EdgespecClient, built on a background thread so the
port answers (with 503) while the drafter's model loads; a server that cannot be
reached yet is waited for with backoff, other load errors are final. ``LinkProbe``
asks the server for its Info over a channel of its own (never the generation's,
which may be mid-reconnect), at most once a second.

Link states: "up" (the server answers), "down" (it does not), "offline" (a
generation is running on the drafter alone, waiting for the link), "unknown"
(nothing known yet: the client is still loading).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from edgespec.shared.errors import EdgespecError

from .link.grpc_transport import LinkConfig, LinkDownError, make_channel, server_info

log = logging.getLogger(__name__)


class ClientNotReadyError(EdgespecError, grpc_code="UNAVAILABLE"):
    """The local API was asked for a generation before its client finished loading (or loading failed)."""


class ClientSlot:
    """The API's EdgespecClient: ready, loading (in the background) or failed."""

    def __init__(self, drafter: str, link: LinkConfig):
        self.drafter = drafter  # the drafter's name, known before it loads
        self.link = link  # how the client reaches the server (the probe uses the same TLS and key)
        self.status = "loading"  # "loading" | "ok" | "failed"
        self.detail = ""  # why it is not ok yet, for a person
        self.offline = False  # set by the API while a generation runs without the link
        self.client = None  # the EdgespecClient once it is ready
        self._stop = threading.Event()
        self._settled = threading.Event()  # set once the client is ready or loading failed

    @classmethod
    def ready(cls, client) -> "ClientSlot":
        slot = cls(client.drafter.name, client.config.link)
        slot._set(client)
        return slot

    @classmethod
    def load_in_background(cls, build: Callable[[], object], drafter: str, link: LinkConfig,
                           retry_initial_s: float = 0.5, retry_max_s: float = 10.0) -> "ClientSlot":
        """Start build() on a thread; a LinkDownError (server not up yet) is retried with backoff."""
        slot = cls(drafter, link)
        threading.Thread(target=slot._load, args=(build, retry_initial_s, retry_max_s), name="edgespec-client-load",
                         daemon=True).start()
        return slot

    def _set(self, client) -> None:
        self.client = client
        self.status, self.detail = "ok", ""
        self._settled.set()

    def wait_settled(self, timeout_s: float | None = None) -> bool:
        """Wait until the client is ready or failed to load; False on timeout."""
        return self._settled.wait(timeout_s)

    def _load(self, build: Callable[[], object], wait_s: float, max_wait_s: float) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                client = build()
            except LinkDownError as err:
                self.detail = f"waiting for the server: {err}"
                log.warning("client not loaded yet, server unreachable; retrying in %.1fs", wait_s,
                            extra={"server": self.link.address, "error": str(err)})
                self._stop.wait(wait_s)
                wait_s = min(max_wait_s, wait_s * 2)
                continue
            except Exception as err:  # a wrong tokenizer, an unknown drafter, a missing model: retrying won't help
                self.status, self.detail = "failed", f"loading the client failed: {err}"
                log.error("client failed to load: %s", err, extra={"drafter": self.drafter})
                self._settled.set()
                return
            if self._stop.is_set():
                client.close()
                return
            self._set(client)
            log.info("client ready", extra={"drafter": self.drafter, "server": self.link.address,
                                            "model": client.model_name,
                                            "load_s": round(time.perf_counter() - t0, 3)})
            return

    def get(self):
        """The client, or ClientNotReadyError saying why there is none."""
        if self.client is not None:
            return self.client
        if self.status == "failed":
            raise ClientNotReadyError(f"the edgespec client is not available: {self.detail}")
        raise ClientNotReadyError("the edgespec client is still loading its drafter; retry shortly"
                                  + (f" ({self.detail})" if self.detail else ""))

    def health(self, link: str) -> dict:
        """The /health body."""
        client = self.client
        body = {"status": self.status, "drafter": self.drafter, "server": self.link.address, "link": link,
                "model": client.model_name if client is not None else None}
        if self.detail:
            body["detail"] = self.detail
        return body

    def close(self) -> None:
        self._stop.set()
        self._settled.set()
        if self.client is not None:
            self.client.close()
            self.client = None


@dataclass
class LinkProbe:
    """Answers "is the server reachable" by an Info call on a channel of its own, cached briefly."""

    link: LinkConfig  # the server's address, TLS and API key, as the client uses them
    timeout_s: float = 1.0  # an Info slower than this counts as down
    max_age_s: float = 1.0  # reuse a probe this recent (health checks can come often)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._channel = None
        self._last: tuple[float, bool] | None = None

    def reachable(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < self.max_age_s:
                return self._last[1]
            if self._channel is None:
                self._channel = make_channel(self.link)
            try:
                server_info(self._channel, self.link, timeout_s=self.timeout_s)
                up = True
            except EdgespecError:
                up = False
                self._channel.close()  # a fresh channel next time: never wait on a dead connection's backoff
                self._channel = None
            self._last = (time.monotonic(), up)
            return up

    def state(self, slot: ClientSlot) -> str:
        if slot.offline:
            return "offline"
        if slot.client is None and slot.status == "loading":
            return "unknown"
        return "up" if self.reachable() else "down"

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
