"""The tree planner as a pure function, on numbers where the answer is known, and the estimates it reads."""
from __future__ import annotations

import pytest

from edgespec.client.planner import PLAIN, PlanInputs, TreeSize, expected_tokens, plan_tree, step_time, tokens_per_s, verify_time
from edgespec.client.step_plan import LoopConfig, LoopEstimates, TreePlanner
from edgespec.shared.tree import DraftTree


def inputs(**over) -> PlanInputs:
    base = dict(round_trip_s=0.02, verify_nodes=(0, 16, 64), verify_s=(0.1, 0.1, 0.1), draft_pass_s=0.0,
                acceptance=(1.0,), nodes_per_depth=2.0, max_nodes=64, max_depth=12)
    return PlanInputs(**{**base, **over})


def test_free_verification_and_perfect_acceptance_give_the_biggest_tree():
    size = plan_tree(inputs(verify_s=(0.0, 0.0, 0.0), acceptance=(1.0,), draft_pass_s=0.0))
    assert size == TreeSize(24, 12)  # the deepest allowed, nodes_per_depth x depth


def test_dear_verification_and_poor_acceptance_give_no_tree():
    # a tree costs 10x a decode step and the drafter is almost never right: plain decode steps win
    size = plan_tree(inputs(verify_nodes=(0, 4, 64), verify_s=(0.1, 1.0, 4.0), acceptance=(0.05,),
                            draft_pass_s=0.01))
    assert size == PLAIN


def test_a_costly_drafter_shortens_the_tree():
    cheap = plan_tree(inputs(acceptance=(0.8,), draft_pass_s=0.001))
    dear = plan_tree(inputs(acceptance=(0.8,), draft_pass_s=0.05))
    assert 0 < dear.depth < cheap.depth


def test_drafting_ahead_hides_the_drafting_behind_the_verification():
    """With every guess right a step costs max(draft, flight): the best tree is the deepest whose drafting
    still fits in the flight (4 passes of 30 ms in a 120 ms flight: depth 3), at about twice the serial rate."""
    serial_in, piped_in = (inputs(acceptance=(0.8,), draft_pass_s=0.03, hit_rate=h) for h in (0.0, 1.0))
    serial, piped = plan_tree(serial_in), plan_tree(piped_in)
    assert piped == TreeSize(6, 3)
    assert tokens_per_s(piped_in, piped) > 1.9 * tokens_per_s(serial_in, serial)
    size = TreeSize(8, 4)
    flight = 0.02 + 0.1
    assert step_time(piped_in, size) == pytest.approx(max(0.15, flight))
    assert step_time(serial_in, size) == pytest.approx(0.15 + flight)


def test_cost_curve_and_expected_tokens():
    assert verify_time(8, (0, 16), (0.1, 0.3)) == pytest.approx(0.2)
    assert verify_time(32, (0, 16), (0.1, 0.3)) == pytest.approx(0.5)  # the last slope beyond the curve
    assert verify_time(5, (4,), (0.2,)) == 0.2
    assert expected_tokens((1.0,), 5) == 6
    assert expected_tokens((0.5, 0.5), 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    with pytest.raises(ValueError, match="ascend"):
        inputs(verify_nodes=(16, 0, 64))


def test_estimates_follow_what_the_loop_sees():
    est = LoopEstimates((0, 16), (0.1, 0.2))
    assert est.inputs(64, 8, pipelined=False) is None  # nothing measured on this link yet
    chain = DraftTree.chain([1, 2, 3, 4])
    for _ in range(20):
        est.observe_draft(chain, 0.05)  # 5 passes
        est.observe_verdict(chain, 1, round_trip_s=0.25, server_s=0.15)  # depth 1 accepted, depth 2 not
    got = est.inputs(64, 8, pipelined=False)
    assert got.round_trip_s == pytest.approx(0.1)
    assert got.draft_pass_s == pytest.approx(0.01)
    assert got.acceptance[0] > 0.9 and got.acceptance[1] < 0.2
    assert dict(zip(got.verify_nodes, got.verify_s))[4] == pytest.approx(0.15)  # the size seen replaces the curve


def test_fixed_keeps_the_drafters_shape_and_auto_explores_after_plain_steps():
    est = LoopEstimates((0, 4), (0.1, 10.0))
    chain = DraftTree.chain([1, 2])
    est.observe_draft(chain, 0.01)
    est.observe_verdict(chain, 0, round_trip_s=10.1, server_s=10.0)
    fixed = TreePlanner(LoopConfig(tree="fixed"), est, 255, can_pipeline=True)
    assert fixed.size(40) == TreeSize(255, 39) and fixed.size(1) == PLAIN
    auto = TreePlanner(LoopConfig(explore_every=3, warmup_trees=1), est, 255, can_pipeline=True)
    sizes = [auto.size(40) for _ in range(8)]
    assert sizes[:3] == [PLAIN] * 3 and sizes[3] == TreeSize(255, 39)  # one tree after 3 plain steps


def test_loop_config_says_what_is_wrong():
    with pytest.raises(ValueError, match="auto"):
        LoopConfig(tree="big")


def test_loops_by_name_and_by_flag():
    import argparse

    from edgespec.client.cli import add_loop_arguments, loop_config
    from edgespec.client.step_plan import LOOP_MODES, loop_mode

    assert loop_mode("independent") == ("independent", LoopConfig())
    assert loop_mode("ngram@serial") == ("ngram", LoopConfig(pipeline=False, tree="fixed"))
    assert set(LOOP_MODES) == {"serial", "pipelined", "auto-serial", "auto"}
    with pytest.raises(ValueError, match="unknown loop 'fast'"):
        loop_mode("ngram@fast")
    p = argparse.ArgumentParser()
    add_loop_arguments(p)
    assert loop_config(p.parse_args([])) == LoopConfig()  # the CLI's default: auto, pipelined
    assert loop_config(p.parse_args(["--no-pipeline", "--tree", "fixed"])) == LoopConfig(pipeline=False, tree="fixed")


def test_auto_keeps_the_drafters_shape_until_enough_trees_are_measured():
    """A prior alone must not settle the loop on plain steps: the first trees are the drafter's own shape."""
    est = LoopEstimates((0, 4), (0.1, 10.0))  # trees look ruinous on this curve
    chain = DraftTree.chain([1, 2])
    auto = TreePlanner(LoopConfig(warmup_trees=3, explore_every=100), est, 255, can_pipeline=False)
    sizes = []
    for _ in range(5):
        size = auto.size(40)
        sizes.append(size)
        if not size.plain:
            est.observe_draft(chain, 0.01)
            est.observe_verdict(chain, 0, round_trip_s=10.1, server_s=10.0)
    assert sizes[:3] == [TreeSize(255, 39)] * 3 and sizes[3:] == [PLAIN] * 2


def test_a_low_hit_rate_drifts_back_so_drafting_ahead_is_tried_again():
    est = LoopEstimates()
    for _ in range(10):
        est.observe_guess(False)
    low = est.hit_rate
    assert low < 0.05
    for _ in range(10):
        est.observe_no_guess()
    assert low < est.hit_rate < est.PRIOR_HIT_RATE
