"""Two machines on one box: the server and the client on disjoint sets of CPU cores.

On the users' setup the client (a laptop) and the server (a GPU box) compute at the same time
without taking cores from each other; on one box they share every core unless each is given its
own. A CPU list is written as taskset writes it ("0", "0-1", "2,3", "0-3,6").

Affinity on Linux belongs to a thread, and a new thread or child process inherits its creator's:
- ``pinned(cpus)`` pins every thread of this process (the client, and the relays it starts later)
  and sets torch's threads to the number of cores, until the block ends;
- ``spawning_on(cpus)`` pins only the calling thread for the length of the block, so a child
  process started inside it (the server) runs on those cores from its first instruction.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Iterator

from edgespec.shared.errors import EdgespecError

CpuSet = frozenset[int]


class CpuSetError(EdgespecError, ValueError):
    """A CPU list that cannot be used here: malformed, naming a CPU this process may not run on, or
    a server and a client that overlap."""


def parse_cpus(text: str) -> CpuSet:
    """"0" -> {0}; "0-2" -> {0, 1, 2}; "2,3" -> {2, 3}; "0-1,4" -> {0, 1, 4}."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if low > high:
                    raise ValueError
                cpus.update(range(low, high + 1))
            else:
                cpus.add(int(part))
        except ValueError:
            raise CpuSetError(f"bad CPU list {text!r}: write CPUs as taskset does, e.g. 0, 0-1 or 2,3") from None
    if any(c < 0 for c in cpus):
        raise CpuSetError(f"bad CPU list {text!r}: CPU numbers are 0 or more")
    return frozenset(cpus)


def format_cpus(cpus: CpuSet) -> str:
    """The shortest CPU list of a set: {0, 1, 2, 5} -> "0-2,5"."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive CPUs
    for c in sorted(cpus):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


CAN_PIN = hasattr(os, "sched_setaffinity")  # Linux; macOS and Windows have no affinity call in Python


def available_cpus() -> CpuSet:
    """The CPUs this process may run on (its affinity, which a container or taskset may have narrowed)."""
    return frozenset(os.sched_getaffinity(0)) if CAN_PIN else frozenset(range(os.cpu_count() or 1))


def check_cpus(cpus: CpuSet, what: str, available: CpuSet) -> CpuSet:
    """`cpus` if every one is available; else an error that names the first missing CPU."""
    if not cpus:
        raise CpuSetError(f"{what}: the CPU list is empty")
    missing = sorted(cpus - available)
    if missing:
        raise CpuSetError(f"{what}: CPU {missing[0]} does not exist here (or this process may not use it); "
                          f"available: {format_cpus(available)}")
    return cpus


@dataclass(frozen=True)
class CpuSplit:
    """Where the server and the client run; None: not pinned (every available core, shared)."""

    server: CpuSet | None  # the server process's cores
    client: CpuSet | None  # the client's (and the relays') cores

    @property
    def pinned(self) -> bool:
        return self.server is not None

    def describe(self) -> str:
        """One line for a person and a report."""
        if not self.pinned:
            return "server and client share every core (not pinned)"
        return (f"server on CPU {format_cpus(self.server)} ({len(self.server)} torch threads), "
                f"client on CPU {format_cpus(self.client)} ({len(self.client)} torch threads)")

    def to_dict(self) -> dict:
        """For a run's recorded environment."""
        if not self.pinned:
            return {"pinned": False}
        return {"pinned": True, "server": format_cpus(self.server), "client": format_cpus(self.client),
                "server_threads": len(self.server), "client_threads": len(self.client)}


NOT_PINNED = CpuSplit(None, None)


def choose_split(server: str | None = None, client: str | None = None, default_pinned: bool = True,
                 available: CpuSet | None = None) -> CpuSplit:
    """The split a run asked for.

    Both lists given: those. One given: the other side gets every other available core. Neither:
    with `default_pinned` and at least 2 cores, the server on the upper half (the odd core too) and
    the client on the lower half, as two machines would be; otherwise not pinned."""
    if available is None:
        available = available_cpus()
        if not CAN_PIN and (server is not None or client is not None):
            raise CpuSetError("--server-cpus/--client-cpus need Linux (CPU affinity); leave them out here")
    if server is None and client is None:
        if not default_pinned or len(available) < 2 or not CAN_PIN:
            return NOT_PINNED
        ordered = sorted(available)
        half = len(ordered) // 2
        return CpuSplit(frozenset(ordered[half:]), frozenset(ordered[:half]))
    s = check_cpus(parse_cpus(server), "--server-cpus", available) if server is not None else None
    c = check_cpus(parse_cpus(client), "--client-cpus", available) if client is not None else None
    if s is None or c is None:
        given, flag = (s, "--server-cpus") if s is not None else (c, "--client-cpus")
        rest = available - given
        if not rest:
            raise CpuSetError(f"{flag} {format_cpus(given)} leaves no core for the other side; "
                              f"available: {format_cpus(available)}")
        s, c = (given, rest) if s is not None else (rest, given)
    overlap = s & c
    if overlap:
        raise CpuSetError(f"--server-cpus {format_cpus(s)} and --client-cpus {format_cpus(c)} share CPU "
                          f"{format_cpus(overlap)}: give them disjoint cores (or --no-pin to share every core)")
    return CpuSplit(s, c)


def _thread_ids() -> list[int]:
    """This process's threads (Linux: /proc/self/task); just this one where /proc is missing."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _set_threads(masks: dict[int, CpuSet]) -> None:
    for tid, mask in masks.items():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, mask)


@contextlib.contextmanager
def pinned(cpus: CpuSet | None) -> Iterator[None]:
    """Every thread of this process on `cpus` and torch's threads set to as many, until the block
    ends (then as before). Threads started inside the block inherit it. None: nothing changes."""
    if cpus is None:
        yield
        return
    import torch

    before = {tid: frozenset(os.sched_getaffinity(tid)) for tid in _thread_ids()}
    threads = torch.get_num_threads()
    _set_threads({tid: cpus for tid in before})
    torch.set_num_threads(len(cpus))
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        # threads started inside the block (gRPC's, torch's pool) go back to what this one had
        mine = before.get(threading.get_native_id(), available_cpus())
        _set_threads({tid: before.get(tid, mine) for tid in _thread_ids()})


@contextlib.contextmanager
def spawning_on(cpus: CpuSet | None) -> Iterator[None]:
    """Only the calling thread on `cpus` for the block: a process started inside it inherits them.
    None: nothing changes."""
    if cpus is None:
        yield
        return
    before = frozenset(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
