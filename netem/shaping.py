"""Timing of one direction of a link, as pure arithmetic on times in seconds.

A chunk read at time `now` first passes the bottleneck (a rate shaper says when
its last byte is through), then travels for a delay drawn from the profile (a
chunk with a lost packet pays one retransmission timeout on top, and every
chunk behind it on the connection waits too, as TCP's in-order delivery
makes it), and is finally held back
until the chunk before it on the same connection has been delivered, so byte
order is kept (FIFO): deliver = max(own time, previous delivery).

Nothing here touches a socket or a clock; the relay passes the times in, and
tests drive it with made-up times.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol

from .profile import DelaySpec, DirectionProfile
from .traces import CsvTrace, MahimahiTrace, load_trace

PACKET_BYTES = 1500  # loss is given per packet; a chunk counts as this many bytes a packet


def sample_delay_ms(spec: DelaySpec, rng: random.Random, mean_ms: float | None = None) -> float:
    """One draw of a one-way delay; `mean_ms` overrides the spec's mean (trace-driven delay).

    normal: clamped at 0 as netem does (the mean of the draws is DelaySpec.expected_ms()).
    uniform: mean +- deviation, clamped at 0. pareto: a Pareto law with this mean and
    standard deviation (shape from the coefficient of variation), so it has a heavy tail.
    """
    mu = spec.mean_ms if mean_ms is None else mean_ms
    s = spec.deviation_ms
    if s == 0:
        return mu
    if spec.distribution == "normal":
        return max(0.0, rng.gauss(mu, s))
    if spec.distribution == "uniform":
        return max(0.0, rng.uniform(mu - s, mu + s))
    if mu == 0:
        return 0.0
    alpha = 1 + math.sqrt(1 + (mu / s) ** 2)  # variance = xm^2 a / ((a-1)^2 (a-2))
    xm = mu * (alpha - 1) / alpha
    return xm * rng.paretovariate(alpha)


class RateShaper(Protocol):
    def release_time(self, now: float, nbytes: int) -> float:
        """When the last of `nbytes` arriving at `now` has passed the bottleneck."""


@dataclass
class TokenBucket:
    """A constant-rate bottleneck with a small burst allowance (GCRA form of a token bucket).

    `tat` is when the link would be idle had it sent everything at exactly `rate`;
    a chunk may leave up to `burst_bytes / rate` earlier than that.
    """

    rate_bytes_s: float  # bottleneck rate, bytes per second
    burst_bytes: float = 16 * 1024  # bytes that may go back-to-back after an idle period
    tat: float = float("-inf")  # theoretical arrival time of the link's next free moment

    def release_time(self, now: float, nbytes: int) -> float:
        self.tat = max(now, self.tat) + nbytes / self.rate_bytes_s
        return max(now, self.tat - self.burst_bytes / self.rate_bytes_s)


@dataclass
class MahimahiShaper:
    """Replays a mahimahi trace: each timestamp (ms, looping) delivers up to 1500 bytes.

    Unused slots are lost, as in mahimahi: the trace is what the link could
    carry, not a queue of credit.
    """

    trace: MahimahiTrace
    start: float  # clock time of the trace's 0 ms
    next_slot: int = 0  # absolute index of the first slot not yet used
    leftover: int = 0  # bytes still free in slot next_slot - 1

    def release_time(self, now: float, nbytes: int) -> float:
        t = now - self.start
        if self.leftover and self.trace.slot_time(self.next_slot - 1) >= t:
            if self.leftover >= nbytes:
                self.leftover -= nbytes
                return self.start + self.trace.slot_time(self.next_slot - 1)
            nbytes -= self.leftover
        self.leftover = 0
        first = max(self.next_slot, self.trace.first_slot_at(t))
        slots = math.ceil(nbytes / self.trace.slot_bytes)
        last = first + slots - 1
        self.leftover = slots * self.trace.slot_bytes - nbytes
        self.next_slot = last + 1
        return self.start + self.trace.slot_time(last)


@dataclass
class CsvRateShaper:
    """A bottleneck whose rate follows a per-second trace (looping); seconds at rate 0 carry nothing."""

    trace: CsvTrace
    start: float  # clock time of the trace's first second
    busy_until: float = 0.0  # trace time when the bottleneck is next free

    def release_time(self, now: float, nbytes: int) -> float:
        t = max(now - self.start, self.busy_until)
        bits = nbytes * 8.0
        while True:
            second = math.floor(t)
            rate = self.trace.rate_bits_s(second)
            capacity = rate * (second + 1 - t)
            if capacity >= bits and rate > 0:
                t += bits / rate
                break
            bits -= capacity
            t = second + 1
        self.busy_until = t
        return self.start + t


class DirectionLink:
    """The timing model of one direction, shared by every connection through the relay.

    Each connection keeps its own FIFO horizon (see `Fifo`), so a slow transfer
    on one connection does not reorder another's bytes, while the bottleneck
    rate is shared as on a real link.
    """

    def __init__(self, profile: DirectionProfile, rto_s: float, rng: random.Random, start: float,
                 burst_bytes: float = 16 * 1024):
        self.profile = profile
        self.rto_s = rto_s
        self.rng = rng
        self.start = start
        self.loss = profile.loss_percent / 100
        self.trace = load_trace(profile.trace) if profile.trace else None
        self.shaper: RateShaper | None = None
        if isinstance(self.trace, MahimahiTrace):
            self.shaper = MahimahiShaper(self.trace, start)
        elif isinstance(self.trace, CsvTrace):
            self.shaper = CsvRateShaper(self.trace, start)
        elif profile.rate_mbit is not None:
            self.shaper = TokenBucket(profile.rate_mbit * 1e6 / 8, burst_bytes)

    def chunk_loss(self, nbytes: int) -> float:
        """Chance a chunk pays a retransmission: the profile's loss is per 1500-byte packet,
        and a chunk of k packets is delayed when any of them is lost."""
        packets = max(1, math.ceil(nbytes / PACKET_BYTES))
        return 1 - (1 - self.loss) ** packets

    def arrival_time(self, now: float, nbytes: int) -> float:
        """When a chunk read at `now` reaches the far side, before FIFO ordering."""
        sent = self.shaper.release_time(now, nbytes) if self.shaper else now
        mean = None
        if isinstance(self.trace, CsvTrace) and self.trace.has_rtt:
            mean = self.trace.rtt_ms(math.floor(sent - self.start)) / 2
        delay_s = sample_delay_ms(self.profile.delay, self.rng, mean) / 1000
        if self.loss and self.rng.random() < self.chunk_loss(nbytes):
            delay_s += self.rto_s
        return sent + delay_s


@dataclass
class Fifo:
    """Keeps one connection's chunks in order: none is delivered before the one ahead of it."""

    horizon: float = float("-inf")  # delivery time of the last chunk scheduled

    def schedule(self, arrival: float) -> float:
        self.horizon = max(arrival, self.horizon)
        return self.horizon
