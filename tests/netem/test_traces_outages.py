from __future__ import annotations

import itertools
import random

import pytest

from edgespec.netem.outages import outage_windows
from edgespec.netem.profile import OutageSchedule, ProfileError, load_profile, traces_dir
from edgespec.netem.traces import load_trace, parse_csv_trace, parse_mahimahi


def test_packaged_traces_load():
    from edgespec.netem.profile import TraceSpec

    sine = load_trace(TraceSpec(traces_dir() / "lte-sine.mahimahi", "mahimahi"))
    assert sine.period_s == pytest.approx(10.0)
    assert len(sine.times_s) * sine.slot_bytes * 8 / sine.period_s == pytest.approx(16e6, rel=0.01)  # bits/s
    profile = load_profile("4g-trace")
    csv_trace = load_trace(profile.down.trace)
    assert len(csv_trace.rates_bits_s) == 60
    assert csv_trace.rate_bits_s(17) == 0 and csv_trace.rate_bits_s(60) == csv_trace.rate_bits_s(0)
    assert csv_trace.rtt_ms(33) == csv_trace.rtt_ms(32)  # a "-" keeps the last RTT


def test_mahimahi_slots_loop():
    t = parse_mahimahi("0\n5\n10\n")
    assert [t.slot_time(k) for k in range(5)] == pytest.approx([0, 0.005, 0.010, 0.010, 0.015])
    assert t.first_slot_at(0.006) == 2 and t.first_slot_at(0.011) == 4


@pytest.mark.parametrize("text, message", [
    ("", "no delivery slot"), ("0\n0\n", "no delivery slot"), ("5\nfive\n", "line 2"),
    ("10\n5\n", "non-decreasing"),
])
def test_bad_mahimahi(text, message):
    with pytest.raises(ProfileError, match=message):
        parse_mahimahi(text, "t.mm")


def test_csv_units_and_errors():
    t = parse_csv_trace("tput\n2\n4\n", "tput", "mbit")
    assert t.rates_bits_s == (2e6, 4e6) and not t.has_rtt
    with pytest.raises(ProfileError, match="no column 'DL_bitrate'.*columns: tput"):
        parse_csv_trace("tput\n2\n", "DL_bitrate")
    with pytest.raises(ProfileError, match="row 3 column 'tput'"):
        parse_csv_trace("tput\n2\nlots\n", "tput")
    with pytest.raises(ProfileError, match="0 everywhere"):
        parse_csv_trace("tput\n0\n-\n", "tput")


def test_fixed_schedule_is_its_windows():
    s = OutageSchedule(kind="fixed", mode="reset", windows=((1.0, 0.5), (4.0, 2.0)))
    assert list(outage_windows(s, random.Random(0))) == [(1.0, 0.5), (4.0, 2.0)]


def test_poisson_schedule_has_the_right_means():
    s = OutageSchedule(kind="poisson", mean_up_s=10.0, mean_down_s=2.0)
    windows = list(itertools.islice(outage_windows(s, random.Random(1)), 20_000))
    downs = [d for _, d in windows]
    ups = [b[0] - (a[0] + a[1]) for a, b in zip(windows, windows[1:])]
    assert sum(downs) / len(downs) == pytest.approx(2.0, rel=0.05)
    assert sum(ups) / len(ups) == pytest.approx(10.0, rel=0.05)
    assert all(u > 0 for u in ups)
