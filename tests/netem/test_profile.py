from __future__ import annotations

import random

import pytest

from edgespec.netem.profile import (DelaySpec, ProfileError, load_profile, parse_profile,
                                    profile_names)
from edgespec.netem.shaping import sample_delay_ms


def test_every_packaged_profile_loads():
    names = profile_names()
    assert {"4g", "5g", "wifi", "3g", "satellite", "ideal"} <= set(names)
    for name in names:
        assert load_profile(name).name == name


def test_4g_and_5g_are_the_papers():
    four, five = load_profile("4g"), load_profile("5g")
    for d in (four.up, four.down):
        assert (d.delay.distribution, d.delay.mean_ms, d.delay.deviation_ms) == ("normal", 21, 19)
        assert d.rate_mbit == 20 and d.loss_percent == 0.1
    for d in (five.up, five.down):
        assert (d.delay.distribution, d.delay.mean_ms, d.delay.deviation_ms) == ("normal", 10, 10)
        assert d.rate_mbit is None and d.loss_percent == 0.1


def test_user_profile_from_a_path_with_direction_overrides(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("both:\n  delay: {distribution: uniform, mean_ms: 30, deviation_ms: 10}\n"
                    "  rate_mbit: 8\nup:\n  rate_mbit: 2\n  delay: {mean_ms: 40}\n"
                    "outages: {kind: poisson, mode: reset, mean_up_s: 30, mean_down_s: 2}\n")
    p = load_profile(path)
    assert p.name == "mine" and p.source == str(path)
    assert p.up.rate_mbit == 2 and p.down.rate_mbit == 8
    assert p.up.delay == DelaySpec("uniform", 40, 10) and p.down.delay == DelaySpec("uniform", 30, 10)
    assert (p.outages.kind, p.outages.mode, p.outages.mean_down_s) == ("poisson", "reset", 2)


@pytest.mark.parametrize("data, field", [
    ({"both": {"delay": {"mean_ms": -1}}}, "both.delay.mean_ms"),
    ({"both": {"delay": {"mean_ms": "fast"}}}, "both.delay.mean_ms"),
    ({"both": {"delay": {"distribution": "gamma"}}}, "both.delay.distribution"),
    ({"both": {"rate_mbit": 0}}, "both.rate_mbit"),
    ({"up": {"loss_percent": 150}}, "up.loss_percent"),
    ({"down": {"latency_ms": 5}}, "down.latency_ms"),
    ({"both": {}, "outages": {"kind": "fixed", "windows": []}}, "outages.windows"),
    ({"both": {}, "outages": {"kind": "fixed", "windows": [{"start_s": 1}]}},
     "outages.windows[0].duration_s"),
    ({"both": {}, "outages": {"kind": "poisson", "mean_up_s": 10}}, "outages.mean_down_s"),
    ({"both": {}, "outages": {"mode": "drop", "windows": [{"start_s": 0, "duration_s": 1}]}},
     "outages.mode"),
    ({"both": {"trace": {"file": "no-such-trace.csv"}}}, "both.trace.file"),
    ({"both": {"trace": {"format": "csv"}}}, "both.trace.file"),
    ({"name": "x"}, ""),
])
def test_bad_fields_are_named(data, field):
    with pytest.raises(ProfileError) as err:
        parse_profile(data, source="bad.yaml")
    assert "bad.yaml" in str(err.value)
    if field:
        assert f"`{field}`" in str(err.value)


def test_unknown_name_lists_the_packaged_ones():
    with pytest.raises(ProfileError, match="4g.*5g"):
        load_profile("6g")


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("both: [unclosed\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "missing.yaml")


@pytest.mark.parametrize("spec", [
    DelaySpec("normal", 21, 19), DelaySpec("normal", 10, 10), DelaySpec("uniform", 10, 15),
    DelaySpec("uniform", 30, 10), DelaySpec("pareto", 300, 30), DelaySpec("pareto", 20, 40),
])
def test_expected_mean_matches_the_draws(spec):
    rng = random.Random(7)
    draws = [sample_delay_ms(spec, rng) for _ in range(200_000)]
    assert min(draws) >= 0
    mean = sum(draws) / len(draws)
    # pareto with sd > mean has a heavy tail: its sample mean converges slowly
    tolerance = 0.05 if spec.deviation_ms > spec.mean_ms and spec.distribution == "pareto" else 0.01
    assert abs(mean - spec.expected_ms()) <= tolerance * spec.expected_ms()
    if spec.distribution == "pareto":
        sd = (sum((d - mean) ** 2 for d in draws) / len(draws)) ** 0.5
        if spec.deviation_ms < spec.mean_ms:
            assert abs(sd - spec.deviation_ms) <= 0.1 * spec.deviation_ms


def test_rto_is_200ms_or_three_rtts():
    assert load_profile("4g").rto_s() == pytest.approx(0.2)
    sat = load_profile("satellite")
    assert sat.rto_s() == pytest.approx(3 * 2 * 300 / 1000)
    assert parse_profile({"both": {}, "rto_ms": 50}).rto_s() == pytest.approx(0.05)
