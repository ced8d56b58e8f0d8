"""Probe traffic that measures a link: round-trip times and throughput each way.

An echo server sits at the far end (in-process behind a relay, or started with
`edgespec netem echo` inside a lab's server namespace) and speaks a tiny binary
protocol, one request = 1 op byte + an 8-byte big-endian argument:

- b"P" seq: answered with the same 9 bytes (a ping: small, so no rate effect).
- b"D" n:   answered with n bytes (download).
- b"U" n:   followed by n bytes from the client; answered with b"K" + the seconds
            and the bytes over which the server timed the upload (float64,
            uint64; see `_receive`), so the receiving side measures the rate.

Throughput is counted from the moment a tenth of the bytes has arrived to the
last byte, so it measures the bottleneck rate, not the delay in front of it nor
the start of a transfer (with jitter and FIFO order, the first chunks of a bulk
transfer still see a growing running maximum of the delay, as under netem).
"""
from __future__ import annotations

import asyncio
import math
import statistics
import struct
import time
from dataclasses import dataclass

_HEAD = struct.Struct(">cQ")
_UPLOAD_ANSWER = struct.Struct(">cdQ")
_BLOCK = 64 * 1024
WARMUP_FRACTION = 0.1  # bytes received before the throughput clock starts


async def _serve_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                op, arg = _HEAD.unpack(await reader.readexactly(_HEAD.size))
            except asyncio.IncompleteReadError:
                return
            if op == b"P":
                writer.write(_HEAD.pack(op, arg))
            elif op == b"D":
                block = bytes(_BLOCK)
                for left in range(arg, 0, -_BLOCK):
                    writer.write(block[:min(left, _BLOCK)])
                    await writer.drain()
            elif op == b"U":
                writer.write(_UPLOAD_ANSWER.pack(b"K", *await _receive(reader, arg)))
            else:
                return  # not our protocol: hang up
            await writer.drain()
    except ConnectionError:
        return
    finally:
        writer.close()


async def start_echo_server(host: str = "127.0.0.1", port: int = 0) -> asyncio.AbstractServer:
    return await asyncio.start_server(_serve_echo, host, port)


async def _receive(reader: asyncio.StreamReader, n: int) -> tuple[float, int]:
    """Read exactly n bytes; (seconds, bytes) counted from the read that completes the first
    tenth (WARMUP_FRACTION) to the last read."""
    marks: list[tuple[float, int]] = []  # (time of a read, bytes received up to it)
    got = 0
    while got < n:
        data = await reader.read(min(_BLOCK, n - got))
        if not data:
            raise ConnectionError(f"link closed after {got} of {n} bytes")
        got += len(data)
        marks.append((time.perf_counter(), got))
    if not marks:
        return 0.0, 0
    t0, b0 = next(m for m in marks if m[1] >= WARMUP_FRACTION * n)
    return marks[-1][0] - t0, n - b0


class Pinger:
    """One connection to the echo server that times round trips, one ping at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.seq = 0

    @classmethod
    async def connect(cls, host: str, port: int) -> "Pinger":
        return cls(*await asyncio.open_connection(host, port))

    async def ping(self) -> float:
        """Seconds from sending a 9-byte ping to having its echo."""
        self.seq += 1
        t0 = time.perf_counter()
        self.writer.write(_HEAD.pack(b"P", self.seq))
        await self.writer.drain()
        op, echoed = _HEAD.unpack(await self.reader.readexactly(_HEAD.size))
        rtt = time.perf_counter() - t0
        if (op, echoed) != (b"P", self.seq):
            raise ConnectionError(f"echo answered {op!r} {echoed}, expected ping {self.seq}")
        return rtt

    def close(self) -> None:
        self.writer.close()


async def ping_rtts(host: str, port: int, count: int, connections: int = 4) -> list[float]:
    """`count` round trips (seconds), spread over parallel connections, each one ping at a time."""
    async def one(n: int) -> list[float]:
        pinger = await Pinger.connect(host, port)
        try:
            return [await pinger.ping() for _ in range(n)]
        finally:
            pinger.close()

    shares = [count // connections + (i < count % connections) for i in range(connections)]
    results = await asyncio.gather(*(one(n) for n in shares if n))
    return [rtt for r in results for rtt in r]


async def download_rate(host: str, port: int, nbytes: int) -> float:
    """Measured rate, bits per second, of `nbytes` sent by the far end."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(_HEAD.pack(b"D", nbytes))
        await writer.drain()
        seconds, counted = await _receive(reader, nbytes)
    finally:
        writer.close()
    return counted * 8 / seconds if seconds > 0 else math.inf


async def upload_rate(host: str, port: int, nbytes: int) -> float:
    """Measured rate, bits per second, of `nbytes` sent to the far end (timed there)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(_HEAD.pack(b"U", nbytes))
        block = bytes(_BLOCK)
        for left in range(nbytes, 0, -_BLOCK):
            writer.write(block[:min(left, _BLOCK)])
            await writer.drain()
        op, seconds, counted = _UPLOAD_ANSWER.unpack(await reader.readexactly(_UPLOAD_ANSWER.size))
    finally:
        writer.close()
    return counted * 8 / seconds if seconds > 0 else math.inf


@dataclass(frozen=True)
class Distribution:
    n: int
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, samples: list[float]) -> "Distribution":
        if not samples:
            raise ValueError("no samples to summarise")
        # linear interpolation between closest ranks (numpy's default); one sample is its every percentile
        q = statistics.quantiles(samples * 2 if len(samples) == 1 else samples, n=100, method="inclusive")
        return cls(len(samples), statistics.fmean(samples), q[49], q[89], q[98])


@dataclass(frozen=True)
class Measurement:
    rtt_ms: Distribution
    down_mbit: float | None  # None when not measured
    up_mbit: float | None


async def measure_link(host: str, port: int, pings: int = 400, connections: int = 4,
                       nbytes: int = 3_000_000) -> Measurement:
    rtts = await ping_rtts(host, port, pings, connections)
    down = up = None
    if nbytes:
        down = await download_rate(host, port, nbytes) / 1e6
        up = await upload_rate(host, port, nbytes) / 1e6
    return Measurement(Distribution.of([r * 1000 for r in rtts]), down, up)


def format_measurement(m: Measurement, profile=None, overhead_ms: float | None = None) -> str:
    """The figures, next to what `profile` (a NetworkProfile) predicts when given."""
    d = m.rtt_ms
    want = ""
    if profile is not None:
        expected = profile.expected_one_way_ms("up") + profile.expected_one_way_ms("down")
        want = f"   (profile: mean {expected:.1f} with loss)"
    lines = [f"round trip (ms, n={d.n}): p50 {d.p50:.1f}  p90 {d.p90:.1f}  p99 {d.p99:.1f}  "
             f"mean {d.mean:.1f}{want}"]
    if overhead_ms is not None:
        lines.append(f"relay's own round trip (ms, ideal profile): mean {overhead_ms:.2f}")
    for label, got, name in (("down", m.down_mbit, "down"), ("up  ", m.up_mbit, "up")):
        if got is None:
            continue
        want = ""
        if profile is not None:
            rate = profile.direction(name).rate_mbit
            want = "   (profile: unlimited)" if rate is None else f"   (profile: {rate:g} Mbit/s)"
        lines.append(f"throughput {label} (Mbit/s): {got:.2f}{want}")
    return "\n".join(lines)
