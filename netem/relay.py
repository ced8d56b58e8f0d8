"""A userspace TCP relay that makes a loopback connection behave like a profile's link.

Clients connect to the relay; for each connection the relay opens one to the
upstream (the server) and forwards bytes both ways. Each direction applies its
profile (see shaping.py): rate, delay per chunk with byte order kept, loss as a
retransmission delay. Whatever runs over it (gRPC's HTTP/2 frames, keepalive
pings) is just bytes.

Outages, driven by hand, by a byte count, or by a schedule:

- blackhole: nothing moves, both ways, but every socket stays open, as when
  packets vanish. Bytes already read are held and delivered on restore (TCP
  would have retransmitted them); new connections are accepted by the kernel
  but not joined to the upstream until restore.
- reset: every open connection is closed with a TCP reset at once, and while
  the cut lasts new connections are reset as soon as they are accepted.

All methods other than start/stop/serve are plain functions that must be called
on the relay's event loop; RelayThread (relay_thread.py) wraps them for threads.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from dataclasses import dataclass

from .outages import outage_windows
from .profile import OUTAGE_MODES, NetworkProfile, OutageSchedule
from .shaping import DirectionLink, Fifo

log = logging.getLogger(__name__)

_EOF = None  # queued after the last chunk of a direction: forward the half-close


@dataclass(frozen=True)
class RelayConfig:
    """How the relay cuts the stream into chunks and how much it may hold."""

    segment_bytes: int = 16 * 1024  # a read is split into chunks of at most this; each gets its own delay
    burst_bytes: int = 16 * 1024  # token-bucket burst: bytes that may go back to back after idling
    max_queued_bytes: int = 1 << 20  # per direction of a connection; beyond it the relay stops reading
    read_bytes: int = 64 * 1024  # largest single read from a socket


@dataclass
class TimerLateness:
    """How late the event loop wakes up after a sleep, learned as the relay runs.

    asyncio rounds sleeps up to whole milliseconds (epoll) and a busy host adds
    scheduling delay: about 1 ms on average on a loaded 2-core machine, which would
    bias every delay upward. The writers wake this much earlier, so the mean
    delivered delay matches the profile; single chunks may land slightly early.
    """

    estimate_s: float = 0.0  # moving average of (woke up - asked to wake up)
    weight: float = 0.05  # share of each new observation in the average
    cap_s: float = 0.005  # never compensate more than this

    def observe(self, late_s: float) -> None:
        self.estimate_s += self.weight * (min(max(late_s, 0.0), self.cap_s) - self.estimate_s)


@dataclass(frozen=True)
class RelayStats:
    """A snapshot of what went through the relay (bytes counted when delivered)."""

    bytes_up: int  # client -> upstream
    bytes_down: int  # upstream -> client
    chunks_up: int
    chunks_down: int
    connections_accepted: int
    connections_open: int
    connections_reset: int  # closed by a reset cut (or refused while one lasted)
    cuts: int  # how many times the link was cut
    state: str  # "up", "blackhole" or "reset"
    held_bytes: int  # read but not yet delivered, all connections
    timer_lateness_ms: float  # how late the loop wakes after a sleep (compensated for)


class Relay:
    def __init__(self, profile: NetworkProfile, upstream: tuple[str, int],
                 listen: tuple[str, int] = ("127.0.0.1", 0), seed: int | None = None,
                 config: RelayConfig | None = None, run_schedule: bool = True):
        self.profile = profile
        self.upstream = upstream
        self.listen = listen
        self.config = config or RelayConfig()
        self._run_profile_schedule = run_schedule
        self._rng = random.Random(seed)
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task] = set()  # connection handlers, cancelled on stop
        self._links: dict[str, DirectionLink] = {}
        self._up = asyncio.Event()
        self._state = "up"
        self._conns: set[_Connection] = set()
        self._waiting: set[asyncio.StreamWriter] = set()  # accepted during a blackhole, not joined yet
        self._counts = dict(bytes_up=0, bytes_down=0, chunks_up=0, chunks_down=0,
                            connections_accepted=0, connections_reset=0, cuts=0)
        self._trigger: tuple[int, str, str] | None = None  # bytes left, mode, direction
        self._schedule_task: asyncio.Task | None = None
        self.lateness = TimerLateness()

    async def start(self) -> "Relay":
        loop = asyncio.get_running_loop()
        now = loop.time()
        for name in ("up", "down"):
            self._links[name] = DirectionLink(self.profile.direction(name), self.profile.rto_s(),
                                              random.Random(self._rng.random()), now,
                                              self.config.burst_bytes)
        self._up.set()
        self._server = await asyncio.start_server(self._on_client, *self.listen)
        if self._run_profile_schedule and self.profile.outages is not None:
            self._schedule_task = loop.create_task(self._follow(self.profile.outages))
        log.info("relay %s listening on %s:%d -> %s:%d", self.profile.name, *self.address,
                 *self.upstream)
        return self

    async def stop(self) -> None:
        if self._schedule_task:
            self._schedule_task.cancel()
        if self._server:
            self._server.close()
        for conn in list(self._conns):
            conn.abort(reset=False)
        for task in list(self._handlers):  # e.g. new connections a blackhole is holding
            task.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=2)
        if self._server:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        self._server = None

    async def __aenter__(self) -> "Relay":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) where clients connect."""
        assert self._server is not None, "relay not started"
        return self._server.sockets[0].getsockname()[:2]

    @property
    def port(self) -> int:
        return self.address[1]

    def cut(self, mode: str = "blackhole") -> None:
        """Take the link down now: "blackhole" (bytes stop, sockets stay open) or "reset"."""
        if mode not in OUTAGE_MODES:
            raise ValueError(f"cut mode must be one of {', '.join(OUTAGE_MODES)}, got {mode!r}")
        self._counts["cuts"] += 1
        self._state = mode
        self._up.clear()
        log.info("relay %s: link cut (%s)", self.profile.name, mode)
        if mode == "reset":
            for conn in list(self._conns):
                conn.abort(reset=True)
                self._counts["connections_reset"] += 1
            for writer in list(self._waiting):
                _abort(writer, reset=True)
                self._counts["connections_reset"] += 1

    def restore(self) -> None:
        """Bring the link back; a blackhole delivers what it held."""
        self._state = "up"
        self._up.set()
        log.info("relay %s: link restored", self.profile.name)

    def cut_after_bytes(self, n: int, mode: str = "blackhole", direction: str = "down") -> None:
        """Cut once `n` more bytes have been delivered in `direction` ("up", "down" or "both").

        The chunk that crosses the mark is split, so exactly n bytes get through.
        """
        if n < 0 or direction not in ("up", "down", "both") or mode not in OUTAGE_MODES:
            raise ValueError(f"cut_after_bytes needs n >= 0, direction up|down|both and mode "
                             f"{'|'.join(OUTAGE_MODES)}; got {n}, {direction!r}, {mode!r}")
        self._trigger = (n, mode, direction) if n else None
        if n == 0:
            self.cut(mode)

    def stats(self) -> RelayStats:
        return RelayStats(**self._counts, connections_open=len(self._conns), state=self._state,
                          held_bytes=sum(c.held_bytes() for c in self._conns),
                          timer_lateness_ms=self.lateness.estimate_s * 1000)

    @property
    def state(self) -> str:
        return self._state

    async def _follow(self, schedule: OutageSchedule) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for start, duration in outage_windows(schedule, random.Random(self._rng.random())):
            await asyncio.sleep(max(0.0, t0 + start - loop.time()))
            self.cut(schedule.mode)
            await asyncio.sleep(duration)
            self.restore()

    async def wait_up(self) -> None:
        await self._up.wait()

    def take(self, direction: str, data: bytes) -> tuple[bytes, bytes, str | None]:
        """Split `data` at an armed byte trigger: (deliver now, hold, mode to cut with)."""
        if self._trigger is None or self._trigger[2] not in (direction, "both"):
            return data, b"", None
        left, mode, which = self._trigger
        if len(data) < left:
            self._trigger = (left - len(data), mode, which)
            return data, b"", None
        self._trigger = None
        return data[:left], data[left:], mode

    def count(self, direction: str, nbytes: int) -> None:
        self._counts[f"bytes_{direction}"] += nbytes
        self._counts[f"chunks_{direction}"] += 1

    async def _on_client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter):
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await self._join(creader, cwriter)
        except asyncio.CancelledError:
            _abort(cwriter, reset=False)
        finally:
            self._handlers.discard(task)

    async def _join(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self._counts["connections_accepted"] += 1
        if self._state == "reset":
            self._counts["connections_reset"] += 1
            _abort(cwriter, reset=True)
            return
        self._waiting.add(cwriter)
        try:
            await self._up.wait()  # a blackhole holds new connections until restore
        finally:
            self._waiting.discard(cwriter)
        if cwriter.transport.is_closing():  # reset while it waited
            return
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError as exc:
            log.warning("relay %s: upstream %s:%d refused: %s", self.profile.name, *self.upstream, exc)
            _abort(cwriter, reset=True)
            return
        if self._state == "reset":  # cut while we were connecting
            _abort(cwriter, reset=True)
            _abort(uwriter, reset=True)
            return
        conn = _Connection(self, creader, cwriter, ureader, uwriter)
        self._conns.add(conn)
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)


class _Connection:
    """One client connection and its upstream twin: two pipes, up and down."""

    def __init__(self, relay: Relay, creader, cwriter, ureader, uwriter):
        self.relay = relay
        self.writers = (cwriter, uwriter)
        self.pipes = (_Pipe(relay, "up", creader, uwriter), _Pipe(relay, "down", ureader, cwriter))
        self.tasks: list[asyncio.Task] = []

    async def run(self) -> None:
        self.tasks = [asyncio.create_task(t) for p in self.pipes for t in (p.read_loop(), p.write_loop())]
        try:
            done, pending = await asyncio.wait(self.tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in done if not t.cancelled() and t.exception() is not None]
            if failed:  # one side broke: the other sees a reset, as through a real middlebox
                self.abort(reset=True)
            elif pending:
                await asyncio.wait(pending)
        finally:
            self.abort(reset=False)

    def abort(self, reset: bool) -> None:
        for t in self.tasks:
            t.cancel()
        for w in self.writers:
            _abort(w, reset=reset)

    def held_bytes(self) -> int:
        return sum(p.queued for p in self.pipes)


class _Pipe:
    """One direction of one connection: a reader that timestamps chunks, a writer that delivers them."""

    def __init__(self, relay: Relay, direction: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter):
        self.relay, self.direction = relay, direction
        self.reader, self.writer = reader, writer
        self.link = relay._links[direction]
        self.fifo = Fifo()
        self.queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        self.queued = 0
        self.room = asyncio.Event()
        self.room.set()

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.relay.config
        while True:
            await self.relay.wait_up()  # blackhole: stop reading, the sender's buffers fill up
            await self.room.wait()
            data = await self.reader.read(cfg.read_bytes)
            now = loop.time()
            if not data:
                self.queue.put_nowait((self.fifo.schedule(now), _EOF))
                return
            for i in range(0, len(data), cfg.segment_bytes):
                seg = data[i:i + cfg.segment_bytes]
                self.queue.put_nowait((self.fifo.schedule(self.link.arrival_time(now, len(seg))), seg))
            self.queued += len(data)
            if self.queued >= cfg.max_queued_bytes:
                self.room.clear()

    async def write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, seg = await self.queue.get()
            wake = due - self.relay.lateness.estimate_s
            if wake > loop.time():
                await asyncio.sleep(wake - loop.time())
                self.relay.lateness.observe(loop.time() - wake)
            if seg is _EOF:
                await self.relay.wait_up()
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                return
            self.queued -= len(seg)
            if self.queued < self.relay.config.max_queued_bytes:
                self.room.set()
            while seg:
                await self.relay.wait_up()
                now_part, seg, cut_mode = self.relay.take(self.direction, seg)
                if now_part:
                    self.writer.write(now_part)
                    await self.writer.drain()
                    self.relay.count(self.direction, len(now_part))
                if cut_mode:
                    await _flushed(self.writer)
                    self.relay.cut(cut_mode)


async def _flushed(writer: asyncio.StreamWriter, timeout: float = 1.0) -> None:
    """Wait until asyncio has handed everything written to the kernel."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while writer.transport.get_write_buffer_size() and loop.time() < end:
        await asyncio.sleep(0.001)


def _abort(writer: asyncio.StreamWriter, reset: bool) -> None:
    """Close a connection; with reset, send a TCP RST (SO_LINGER 0) instead of a FIN."""
    transport = writer.transport
    if transport.is_closing():
        return
    if reset:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()
