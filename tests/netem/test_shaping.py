"""The timing model on made-up clocks: no sockets, no sleeping."""
from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgespec.netem.profile import DelaySpec, DirectionProfile, TraceSpec
from edgespec.netem.shaping import (CsvRateShaper, DirectionLink, Fifo, MahimahiShaper, TokenBucket)
from edgespec.netem.traces import CsvTrace, parse_mahimahi


def test_token_bucket_sustains_its_rate_after_the_burst():
    bucket = TokenBucket(rate_bytes_s=1_000_000, burst_bytes=10_000)
    t = [bucket.release_time(0.0, 10_000) for _ in range(100)]  # 1 MB offered at once
    assert t[0] == 0.0  # the first 10 kB fit in the burst
    assert t[-1] == pytest.approx(1.0 - 0.01)  # 1 MB at 1 MB/s, less the burst
    assert all(b >= a for a, b in zip(t, t[1:]))


def test_token_bucket_idle_link_sends_at_once():
    bucket = TokenBucket(rate_bytes_s=1000, burst_bytes=500)
    assert bucket.release_time(10.0, 100) == 10.0
    assert bucket.release_time(20.0, 400) == 20.0


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 0.5)), min_size=1, max_size=200))
def test_fifo_keeps_order_and_never_delivers_early(steps):
    fifo, now, last = Fifo(), 0.0, float("-inf")
    for gap, delay in steps:
        now += gap
        arrival = now + delay
        delivered = fifo.schedule(arrival)
        assert delivered >= arrival and delivered >= last
        assert delivered == max(arrival, last)
        last = delivered


def test_loss_is_per_packet_and_costs_one_rto():
    link = DirectionLink(DirectionProfile(DelaySpec("normal", 0, 0), loss_percent=1.0), rto_s=0.2,
                         rng=random.Random(3), start=0.0)
    assert link.chunk_loss(100) == pytest.approx(0.01)
    assert link.chunk_loss(15_000) == pytest.approx(1 - 0.99 ** 10)
    draws = [link.arrival_time(0.0, 100) for _ in range(100_000)]
    assert set(draws) == {0.0, 0.2}
    lost = draws.count(0.2) / len(draws)
    assert 0.008 < lost < 0.012  # 0.01 +- 6 standard errors


def test_mahimahi_shaper_uses_slots_and_loses_idle_ones():
    trace = parse_mahimahi("1\n2\n2\n4\n")  # 4 slots in a 4 ms period
    shaper = MahimahiShaper(trace, start=100.0)
    assert shaper.release_time(100.0, 1500) == pytest.approx(100.001)
    assert shaper.release_time(100.0, 3000) == pytest.approx(100.002)  # both slots at 2 ms
    assert shaper.release_time(100.0, 100) == pytest.approx(100.004)
    assert shaper.release_time(100.0, 1400) == pytest.approx(100.004)  # rest of that slot
    assert shaper.release_time(100.0, 1) == pytest.approx(100.005)  # next loop: 4 + 1 ms
    # idle until 10.5 ms: the third loop's slots at 9 and 10 ms are gone; the next is at 12 ms
    assert shaper.release_time(100.0105, 1500) == pytest.approx(100.012)


def test_mahimahi_rate_over_a_long_transfer():
    trace = parse_mahimahi("\n".join(str(ms) for ms in range(1, 1001)))  # 1 slot a ms: 12 Mbit/s
    assert len(trace.times_s) * trace.slot_bytes * 8 / trace.period_s == pytest.approx(12e6)
    shaper = MahimahiShaper(trace, start=0.0)
    done = [shaper.release_time(0.0, 16_000) for _ in range(300)]  # 4.8 MB
    assert 4.8e6 * 8 / done[-1] / 1e6 == pytest.approx(12, rel=0.01)


def test_csv_shaper_follows_the_seconds_and_skips_dead_ones():
    trace = CsvTrace(rates_bits_s=(8e6, 0.0, 16e6), rtts_ms=None)
    shaper = CsvRateShaper(trace, start=0.0)
    assert shaper.release_time(0.0, 500_000) == pytest.approx(0.5)  # 4 Mbit at 8 Mbit/s
    # 1 MB more: 0.5 MB fill second 0, second 1 carries nothing, 0.5 MB take 0.25 s of second 2
    assert shaper.release_time(0.0, 1_000_000) == pytest.approx(2.25)
    # the trace loops: second 3 is second 0 again
    assert shaper.release_time(3.0, 100_000) == pytest.approx(3.1)


def test_csv_trace_rtt_sets_the_delay(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("DL_bitrate,RTT_ms\n8000,100\n8000,40\n")
    spec = DirectionProfile(DelaySpec("normal", 999, 0),
                            trace=TraceSpec(path, "csv", rtt_column="RTT_ms"))
    link = DirectionLink(spec, rto_s=0.2, rng=random.Random(0), start=0.0)
    assert link.arrival_time(0.0, 1000) == pytest.approx(0.001 + 0.050)  # 8 kbit at 8 Mbit/s, rtt/2
    assert link.arrival_time(1.5, 1000) == pytest.approx(1.501 + 0.020)


def test_timer_lateness_learns_the_average_and_is_capped():
    from edgespec.netem.relay import TimerLateness

    lateness = TimerLateness()
    for _ in range(200):
        lateness.observe(0.001)
    assert lateness.estimate_s == pytest.approx(0.001, rel=0.01)
    for _ in range(200):
        lateness.observe(0.5)  # a stalled host: never compensate more than the cap
    assert lateness.estimate_s == pytest.approx(lateness.cap_s, rel=0.01)
    lateness.observe(-1.0)  # woke early: counts as on time
    assert lateness.estimate_s < lateness.cap_s
