"""What the relay does to a stream: order under jitter, outages, byte-count cuts, schedules, traces."""
from __future__ import annotations

import asyncio
import random
import socket

import pytest

from edgespec.netem.measure import Distribution, download_rate, ping_rtts, start_echo_server
from edgespec.netem.profile import parse_profile
from edgespec.netem.relay import Relay, RelayConfig

QUIET = 0.5  # seconds of silence that stand for "nothing gets through"


async def _nothing_arrives(reader: asyncio.StreamReader, n: int = 1) -> bool:
    try:
        await asyncio.wait_for(reader.readexactly(n), QUIET)
    except asyncio.TimeoutError:
        return True
    return False


async def _recv_until_quiet(loop, sock) -> tuple[bytes, str]:
    """Bytes received until QUIET passes with none, EOF, or a reset (bytes before it are kept),
    and which of "quiet", "eof", "reset" ended it."""
    got = b""
    while True:
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), QUIET)
        except asyncio.TimeoutError:
            return got, "quiet"
        except ConnectionResetError:
            return got, "reset"
        if not chunk:
            return got, "eof"
        got += chunk


def test_byte_order_is_kept_under_heavy_jitter(raw_echo):
    # 0-20 ms uniform per 512-byte chunk: draws out of order all the time, bytes must not be.
    profile = parse_profile({"both": {"delay": {"distribution": "uniform", "mean_ms": 10,
                                                "deviation_ms": 10}}})
    rng = random.Random(0)
    payload = rng.randbytes(400_000)

    async def run():
        async with raw_echo() as addr, Relay(profile, addr, seed=1,
                                             config=RelayConfig(segment_bytes=512)) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)

            async def send():
                i = 0
                while i < len(payload):
                    n = rng.randint(1, 20_000)
                    writer.write(payload[i:i + n])
                    await writer.drain()
                    i += n
                    await asyncio.sleep(rng.random() * 0.002)
                writer.write_eof()

            sender = asyncio.create_task(send())
            echoed = await asyncio.wait_for(reader.read(-1), 30)  # until EOF
            await sender
            stats = relay.stats()
            writer.close()
        return echoed, stats

    echoed, stats = asyncio.run(run())
    assert len(echoed) == len(payload)
    assert echoed == payload
    assert stats.bytes_up == stats.bytes_down == len(payload)
    assert stats.chunks_up >= len(payload) // 512


def test_blackhole_holds_bytes_keeps_sockets_and_delivers_on_restore(raw_echo):
    profile = parse_profile({"both": {"delay": {"mean_ms": 5}}})

    async def run():
        async with raw_echo() as addr, Relay(profile, addr) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)
            writer.write(b"hello")
            assert await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"

            relay.cut("blackhole")
            writer.write(b"world")
            await writer.drain()
            assert await _nothing_arrives(reader)
            assert not reader.at_eof()
            late_reader, late_writer = await asyncio.open_connection(*relay.address)
            late_writer.write(b"late")
            assert await _nothing_arrives(late_reader)
            stats = relay.stats()
            assert stats.state == "blackhole" and stats.connections_open == 1 and stats.cuts == 1

            relay.restore()
            assert await asyncio.wait_for(reader.readexactly(5), 5) == b"world"
            assert await asyncio.wait_for(late_reader.readexactly(4), 5) == b"late"
            assert relay.stats().connections_open == 2
            for w in (writer, late_writer):
                w.close()

    asyncio.run(run())


def test_reset_closes_connections_at_once_and_refuses_until_restore(raw_echo):
    profile = parse_profile({"both": {"delay": {"mean_ms": 5}}})

    async def broken(reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(100), 2) == b""  # EOF counts as broken too
        except ConnectionResetError:
            return True

    async def run():
        async with raw_echo() as addr, Relay(profile, addr) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"

            loop = asyncio.get_running_loop()
            t0 = loop.time()
            relay.cut("reset")
            assert await broken(reader)
            assert loop.time() - t0 < 1.0
            again_reader, _ = await asyncio.open_connection(*relay.address)
            assert await broken(again_reader)
            assert relay.stats().connections_reset == 2

            relay.restore()
            reader, writer = await asyncio.open_connection(*relay.address)
            writer.write(b"back")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"back"
            writer.close()

    asyncio.run(run())


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
def test_cut_after_bytes_lets_exactly_n_through(raw_echo, mode):
    profile = parse_profile({"both": {"delay": {"mean_ms": 2}}})

    async def run():
        async with raw_echo() as addr, Relay(profile, addr) as relay:
            # a plain socket: asyncio's StreamReader drops buffered bytes once it sees a reset
            loop = asyncio.get_running_loop()
            sock = socket.create_connection(relay.address)
            sock.setblocking(False)
            relay.cut_after_bytes(1000, mode=mode, direction="down")
            await loop.sock_sendall(sock, bytes(range(256)) * 20)  # 5120 bytes
            got, ended = await _recv_until_quiet(loop, sock)
            assert got == (bytes(range(256)) * 20)[:1000]
            assert relay.stats().state == mode
            assert ended == ("quiet" if mode == "blackhole" else "reset")
            if mode == "blackhole":
                relay.restore()
                rest, _ = await _recv_until_quiet(loop, sock)
                assert got + rest == bytes(range(256)) * 20
            sock.close()

    asyncio.run(run())


def test_fixed_schedule_cuts_and_restores_on_time(raw_echo, timed_attempts):
    profile = parse_profile({"both": {}, "outages": {"kind": "fixed", "mode": "blackhole",
                                                     "windows": [{"start_s": 0.3, "duration_s": 0.6}]}})

    async def measure():
        async with raw_echo() as addr, Relay(profile, addr) as relay:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            samples = []
            while loop.time() - t0 < 1.3:
                samples.append((loop.time() - t0, relay.state))
                await asyncio.sleep(0.02)
        return samples

    def check(samples):
        states = "".join(state[0] for _, state in samples)
        if states.strip("u").strip("b") != "" or "b" not in states or not states.endswith("u"):
            return f"expected up, blackhole, up; saw {states}"
        down = [t for t, state in samples if state == "blackhole"]
        if down[0] < 0.29 or not 0.45 <= down[-1] - down[0] <= 0.8:
            return f"blackhole seen from {down[0]:.2f} s to {down[-1]:.2f} s, expected 0.3 to 0.9 s"
        return None

    timed_attempts(measure, check)


def test_poisson_schedule_toggles_the_link(raw_echo):
    profile = parse_profile({"both": {}, "outages": {"kind": "poisson", "mode": "reset",
                                                     "mean_up_s": 0.1, "mean_down_s": 0.05}})

    async def run():
        async with raw_echo() as addr, Relay(profile, addr, seed=4) as relay:
            await asyncio.sleep(1.5)
            return relay.stats()

    stats = asyncio.run(run())
    assert stats.cuts >= 3  # about 10 expected in 1.5 s


def test_mahimahi_trace_drives_the_rate(tmp_path, timed_attempts):
    trace = tmp_path / "flat.mahimahi"
    trace.write_text("\n".join(str(ms) for ms in range(1, 1001)) + "\n")  # 12 Mbit/s
    profile = parse_profile({"both": {"trace": {"file": str(trace)}}})

    async def measure():
        echo = await start_echo_server()
        try:
            async with Relay(profile, echo.sockets[0].getsockname()[:2]) as relay:
                return await download_rate(*relay.address, 1_500_000) / 1e6
        finally:
            echo.close()

    timed_attempts(measure, lambda rate: None if abs(rate - 12) <= 1.2 else f"{rate:.2f} Mbit/s vs 12")


def test_csv_trace_drives_rate_and_delay(tmp_path, timed_attempts):
    trace = tmp_path / "flat.csv"
    trace.write_text("DL_bitrate,RTT_ms\n" + "8000,60\n" * 10)
    # the profile's own 5 ms is replaced by the trace's RTT / 2
    profile = parse_profile({"both": {"delay": {"mean_ms": 5},
                                      "trace": {"file": str(trace), "rtt_column": "RTT_ms"}}})

    async def measure():
        echo = await start_echo_server()
        try:
            async with Relay(profile, echo.sockets[0].getsockname()[:2]) as relay:
                rtts = await ping_rtts(*relay.address, 80, 8)
                rate = await download_rate(*relay.address, 1_000_000)
        finally:
            echo.close()
        return Distribution.of([r * 1000 for r in rtts]).p50, rate / 1e6

    def check(result):
        rtt, rate = result  # no jitter: every RTT is 2 x 30 ms plus the relay's own time
        if 59 <= rtt <= 64 and abs(rate - 8) <= 0.8:
            return None
        return f"median rtt {rtt:.1f} ms vs 60, rate {rate:.2f} Mbit/s vs 8"

    timed_attempts(measure, check)


def test_reset_during_a_blackhole_also_resets_connections_it_was_holding(raw_echo):
    profile = parse_profile({"both": {}})

    async def run():
        async with raw_echo() as addr, Relay(profile, addr) as relay:
            relay.cut("blackhole")
            loop = asyncio.get_running_loop()
            sock = socket.create_connection(relay.address)
            sock.setblocking(False)
            await asyncio.sleep(0.1)  # let the relay accept it and hold it
            relay.cut("reset")
            got, ended = await _recv_until_quiet(loop, sock)
            assert (got, ended) == (b"", "reset")
            relay.restore()
            assert relay.stats().connections_open == 0
            sock.close()

    asyncio.run(run())
