"""`bench gpu-projection`: the planner's step charge over a run's trees, a GPU cost curve and a profile's link."""
from __future__ import annotations

import pytest

from edgespec.netem.bench.gpu_projection import (DrafterFigures, Link, figures_of, link_of, parse_curve,
                                                 plain_tokens_per_s, step_s)

CURVE = ((0, 32), (0.005, 0.007))


def metrics(**kw):
    base = dict(num_verifications=10, num_accepted_tokens=15, num_draft_tokens=40, num_drafts=10, draft_s=1.0,
                guesses=8, guess_hits=2, bytes_up=1000, bytes_down=9000, calls=11)
    return {**base, **kw}


def test_figures_sum_every_prompt_of_a_method():
    runs = [{"method": "eagle", "metrics": metrics()}, {"method": "eagle", "metrics": metrics(num_accepted_tokens=5)},
            {"method": "target", "metrics": None}]
    f = figures_of(runs, "eagle")
    assert f.tau == pytest.approx((20 + 20) / 20) and f.nodes == 4.0 and f.draft_s == pytest.approx(0.1)
    assert f.hit_rate == pytest.approx(4 / 16) and f.bytes_per_step == pytest.approx(20000 / 22)
    assert figures_of(runs, "eagle", draft_ms=12).draft_s == pytest.approx(0.012)
    with pytest.raises(ValueError, match="target"):
        figures_of(runs, "target")


def test_a_tree_is_charged_its_own_drafting_not_the_missed_guesses_drafted_while_waiting():
    """1.0 s of drafting over 10 trees, 0.6 s of it ahead of verdicts, of which 0.1 s made trees that went out
    (hits): 0.5 s was drafted for guesses that missed while the client waited, so a tree cost 50 ms."""
    runs = [{"method": "eagle", "metrics": metrics(draft_ahead_s=0.6, saved_s=0.1)}]
    assert figures_of(runs, "eagle").draft_s == pytest.approx(0.05)
    serial = [{"method": "eagle", "metrics": metrics(draft_ahead_s=0.0, saved_s=0.0)}]
    assert figures_of(serial, "eagle").draft_s == pytest.approx(0.1)


def test_a_step_is_the_better_of_serial_and_drafting_ahead():
    link = Link("x", 0.040, None)
    serial_only = DrafterFigures("a", 2.0, 16, 0.010, 0.0, 0)
    assert step_s(serial_only, link, CURVE) == pytest.approx(0.010 + 0.040 + 0.006)
    # Every guess right: the drafting hides behind the flight.
    all_hits = DrafterFigures("a", 2.0, 16, 0.010, 1.0, 0)
    assert step_s(all_hits, link, CURVE) == pytest.approx(0.046)
    # A slow drafter with every guess right: the flight hides behind the drafting instead.
    slow = DrafterFigures("a", 2.0, 16, 0.200, 1.0, 0)
    assert step_s(slow, link, CURVE) == pytest.approx(0.200)
    # A rate adds the bytes' time to the flight.
    assert step_s(DrafterFigures("a", 2.0, 16, 0.0, 0.0, 125_000), Link("y", 0.040, 1.25e6), CURVE) == \
        pytest.approx(0.040 + 0.1 + 0.006)


def test_the_plain_api_streams_after_one_round_trip():
    assert plain_tokens_per_s(100, Link("x", 0.05, None), 0.005) == pytest.approx(100 / 0.55)


def test_profiles_give_their_mean_round_trip_and_rate():
    five, four = link_of("5g"), link_of("4g")
    # 2 x 10 ms and 2 x 21 ms, each a little more: delays cut at zero, and 0.1 % loss paying a timeout
    assert 0.020 < five.round_trip_s < 0.024 and five.rate_bytes_s is None
    assert 0.042 < four.round_trip_s < 0.047 and four.rate_bytes_s == pytest.approx(20e6 / 8)


@pytest.mark.parametrize("bad", ["", "32:6.4", "0:x", "a:b,c"])
def test_bad_curves_are_refused_with_the_form_they_need(bad):
    with pytest.raises(SystemExit, match="verify-ms"):
        parse_curve(bad)
