"""Fixtures for the netem tests: raw echo servers and helpers that run a relay in one event loop."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from edgespec.netem.profile import parse_profile


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send back every byte received, until EOF."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.asynccontextmanager
async def raw_echo_server():
    """(host, port) of a TCP server that echoes bytes back."""
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[:2]
    finally:
        server.close()


def make_profile(**direction) -> object:
    """A profile with the same settings both ways, e.g. make_profile(delay={...}, rate_mbit=5)."""
    return parse_profile({"name": "test", "both": direction})


@pytest.fixture
def profile_factory():
    return make_profile


@pytest.fixture
def raw_echo():
    """`async with raw_echo() as (host, port):` a TCP echo server for the test's event loop."""
    return raw_echo_server


# ------------------------------------------------------------ timing on a shared machine

STARVED_LAG_MS = 3.0  # mean event-loop lag above which a timing run says more about the host
STARVED_FRACTION = 0.01  # ... or share of the run the loop spent stalled (wakeups > 2 ms late)


@contextlib.contextmanager
def _raised_priority(nice: int = -10):
    """Raise this thread's priority (Linux: nice is per thread) while it times a link.

    The relay sleeps almost all the time, so this takes little CPU from anyone; it only
    gets it woken on time, as a kernel qdisc would be. Without permission it does nothing.
    """
    import os
    import threading

    tid = threading.get_native_id()
    try:
        old = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (OSError, AttributeError):
        yield False
        return
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, tid, old)


async def _with_loop_lag(coro):
    """(result of coro, mean lag in ms of a 5 ms canary sleep on this loop meanwhile, share of
    the run lost to stalls). One long stall hides in the mean but not in the share."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    start = loop.time()

    async def canary():
        while True:
            t = loop.time()
            await asyncio.sleep(0.005)
            lags.append(loop.time() - t - 0.005)

    task = asyncio.create_task(canary())
    try:
        result = await coro
    finally:
        task.cancel()
    stalled = sum(lag - 0.002 for lag in lags if lag > 0.002) / max(1e-9, loop.time() - start)
    return result, 1000 * sum(lags) / max(1, len(lags)), stalled


def _timed_attempts(measure, check, attempts: int = 3):
    """Run `measure()` (an async function) with raised priority and a loop-lag canary.

    `check(result)` returns None when the result is right, else what is wrong. A wrong
    result from a starved run (mean lag > STARVED_LAG_MS, or stalled for more than
    STARVED_FRACTION of the run) is measured again; if every
    attempt is starved the test is skipped with the figures, never passed. A wrong
    result from a run that was not starved fails at once.
    """
    seen = []
    for _ in range(attempts):
        with _raised_priority():
            result, lag, stalled = asyncio.run(_with_loop_lag(measure()))
        problem = check(result)
        if problem is None:
            return result
        host = f"event-loop lag {lag:.1f} ms, stalled {stalled:.1%} of the run"
        if lag <= STARVED_LAG_MS and stalled <= STARVED_FRACTION:
            pytest.fail(f"{problem} ({host}: the host was not starved)")
        seen.append(f"{problem} ({host})")
    pytest.skip("host too busy to time a link; every attempt starved: " + "; ".join(seen))


@pytest.fixture
def timed_attempts():
    return _timed_attempts
