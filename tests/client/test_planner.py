"""The tree planner as a pure function, on numbers where the answer is known, and the estimates it reads."""
from __future__ import annotations

import math

import pytest

from edgespec.client.loop.tree_size import (PLAIN, PlanInputs, TreeSize, best_tree, expected_tokens, path_floors,
                                            plain_step, plan_tree, probe_tree, step_time, switch_cost, switch_pays,
                                            tokens_per_s, verify_time)
from edgespec.client.loop.planner import LoopConfig, LoopEstimates, TreePlanner
from edgespec.shared.tree import ROOT, DraftTree


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


def test_a_miss_that_stops_at_its_verdict_costs_a_serial_cycle():
    """Drafting (5 passes of 50 ms) outlasts the flight (120 ms), half the guesses hit. Where a verdict that
    rules a tree out stops it, a miss costs the flight and the drafting after it (0.37 s, a serial cycle) and a
    hit the tree drafted ahead, one level deeper (0.30 s): 0.335 s a step. Where nothing stops it, a miss
    waited for the whole tree first, so drafting ahead lost to the serial loop (0.375 s against 0.37 s)."""
    size = TreeSize(8, 4)
    stopping = inputs(acceptance=(0.8,), draft_pass_s=0.05, hit_rate=0.5, stop_missed=True)
    assert step_time(stopping, size) == pytest.approx(0.5 * 0.30 + 0.5 * 0.37)
    assert step_time(inputs(acceptance=(0.8,), draft_pass_s=0.05, hit_rate=0.5), size) == pytest.approx(0.37)
    # with every guess right, the bonus level is the only difference from the serial-loop count
    assert step_time(inputs(draft_pass_s=0.05, hit_rate=1.0, stop_missed=True), size) == pytest.approx(0.30)


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


def test_path_floors_charge_a_level_what_it_adds_to_the_step():
    """Serially every level costs a pass (50 ms), so a path must be worth the planned rate x 50 ms at every
    depth. Drafted ahead with every guess right, a level is free while the drafting (a pass more than the serial
    count, 30 ms each) fits in the flight (120 ms: depths 1 to 2) and costs a pass beyond; with half the guesses
    right, a level costs half a pass on the misses alone until the drafting outlasts the flight."""
    serial = inputs(acceptance=(0.8,), draft_pass_s=0.05)
    rate = tokens_per_s(serial, plan_tree(serial))
    assert path_floors(serial, plan_tree(serial)) == pytest.approx([rate * 0.05] * 11)
    ahead = inputs(acceptance=(0.8,), draft_pass_s=0.03, hit_rate=1.0, stop_missed=True)
    rate = tokens_per_s(ahead, plan_tree(ahead))
    assert path_floors(ahead, plan_tree(ahead)) == pytest.approx([0.0] + [rate * 0.03] * 10)
    half = inputs(acceptance=(0.8,), draft_pass_s=0.03, hit_rate=0.5, stop_missed=True)
    floors, rate = path_floors(half, plan_tree(half)), tokens_per_s(half, plan_tree(half))
    assert floors[0] == pytest.approx(rate * 0.015) and floors[-1] == pytest.approx(rate * 0.03)
    assert all(b >= a - 1e-9 for a, b in zip(floors, floors[1:]))  # a deeper level never costs less


def test_calibration_is_the_tokens_accepted_for_each_one_the_drafters_probabilities_promised():
    """A chain of 3 whose paths the drafter gave 0.5, 0.25 and 0.125 promises 0.875 tokens; the target accepting
    2 of them every time is 2 / 0.875 accepted a promised token, and halves a floor at twice the calibration.
    Without scores (or before any) it is 1; a run of verdicts the drafter got all wrong stops at the range's
    floor rather than at 0, which would stop every tree at its root."""
    est = LoopEstimates((0, 16), (0.1, 0.2))
    assert est.calibration() == 1.0
    chain = DraftTree.chain([1, 2, 3])
    scores = [math.log(0.5), math.log(0.25), math.log(0.125)]
    for _ in range(5):
        est.observe_verdict(chain, 2, round_trip_s=0.1, server_s=0.05, scores=scores)
        est.observe_verdict(chain, 1, round_trip_s=0.1, server_s=0.05)  # no scores: not counted
    assert est.calibration() == pytest.approx(2 / 0.875)
    for _ in range(60):
        est.observe_verdict(chain, 0, round_trip_s=0.1, server_s=0.05, scores=scores)
    assert est.calibration() == LoopEstimates.CALIBRATION_RANGE[0]
    plan = inputs(acceptance=(0.8,), draft_pass_s=0.05)
    assert path_floors(plan, plan_tree(plan), 2.0) == pytest.approx([f / 2 for f in path_floors(plan, plan_tree(plan))])
    with pytest.raises(ValueError, match="calibration must be positive"):
        path_floors(plan, plan_tree(plan), 0.0)


def test_a_drafter_that_stops_by_its_paths_gets_the_whole_depth_and_the_floors():
    """The planner's depth (from the average acceptance) caps the trees of a drafter that cannot stop by its
    paths' probabilities (ngram); one that can gets every depth the step allows, and the floors to stop by."""
    est = LoopEstimates((0, 16), (0.1, 0.2))
    chain = DraftTree.chain([1, 2, 3, 4])
    for _ in range(10):
        est.observe_draft(chain, 0.1)
        est.observe_verdict(chain, 2, round_trip_s=0.15, server_s=0.15)
    capped = TreePlanner(LoopConfig(warmup_trees=0, depth_by_path=True), est, 64, can_pipeline=True).size(40)
    by_path = TreePlanner(LoopConfig(warmup_trees=0, depth_by_path=True), est, 64, can_pipeline=True,
                          by_path=True).size(40)
    off = TreePlanner(LoopConfig(warmup_trees=0), est, 64, can_pipeline=True, by_path=True).size(40)
    assert 0 < capped.depth < 16 and not capped.floors and off == capped and not off.floors
    assert by_path.depth == 16 and len(by_path.floors) == 15 and 0 < by_path.floors[-1] <= 1


def test_fixed_keeps_the_drafters_shape_and_auto_probes_with_the_smallest_tree_that_could_win():
    """While plain steps win, a probe is the shallowest tree that would win were all of it accepted (here one
    node: a decode step costs 0.1 s, a one-node tree 0.16 s with its drafting), not the drafter's whole shape.
    The generation's first plain step probes; the next probe waits until what it is expected to lose (0.16 s
    less 1.06 tokens' worth of plain steps: 0.054 s) is explore_share (5 %) of the plain steps' time: 11 steps."""
    est = LoopEstimates((0, 16), (0.1, 0.74))
    chain = DraftTree.chain([1, 2])
    for _ in range(20):
        est.observe_draft(chain, 0.03)
        est.observe_verdict(chain, 0, round_trip_s=0.18, server_s=0.18)
    fixed = TreePlanner(LoopConfig(tree="fixed"), est, 255, can_pipeline=True)
    assert fixed.size(40) == TreeSize(255, 39) and fixed.size(1) == PLAIN
    auto = TreePlanner(LoopConfig(explore_every=3, warmup_trees=1), est, 255, can_pipeline=False)
    sizes = [auto.size(40) for _ in range(14)]
    probe = TreeSize(1, 1)
    assert sizes == [probe] + [PLAIN] * 10 + [probe] + [PLAIN] * 2


def test_auto_does_not_probe_where_no_tree_could_win():
    est = LoopEstimates((0, 4), (0.1, 10.0))  # a tree costs 100 plain steps: not even a whole one pays
    chain = DraftTree.chain([1, 2])
    est.observe_draft(chain, 0.01)
    est.observe_verdict(chain, 0, round_trip_s=10.1, server_s=10.0)
    auto = TreePlanner(LoopConfig(explore_every=3, warmup_trees=1), est, 255, can_pipeline=True)
    assert all(auto.size(40).plain for _ in range(20))  # main's: the drafter's whole shape every fourth


def test_probe_tree_is_the_shallowest_that_would_win_if_accepted_whole():
    # a decode step 0.1 s; a tree of depth d: 0.1 + 0.05 d to verify (d nodes) and 0.02 (d + 1) to draft
    base = dict(round_trip_s=0.0, verify_nodes=(0, 16), verify_s=(0.1, 0.9), draft_pass_s=0.02, acceptance=(0.1,),
                nodes_per_depth=1.0, max_nodes=64, max_depth=12)
    # whole, depth d commits d + 1 tokens in 0.12 + 0.07 d s: more than plain's 10 a second from d = 1 (2 / 0.19)
    assert probe_tree(inputs(**base)) == TreeSize(1, 1)
    # a dearer drafter: 0.1 s a pass, (d + 1) / (0.2 + 0.15 d) > 10 needs d > 1 / -0.5: never
    assert probe_tree(inputs(**{**base, "draft_pass_s": 0.1})) == PLAIN
    # a tree path with a fixed cost (as on a one-core CPU server): a one-node tree 0.25 s more than a decode step,
    # then 0.05 s a node: (d + 1) / (0.32 + 0.07 d) > 10 from d = 8; at 0.55 s more, from d = 18, past max_depth
    assert probe_tree(inputs(**{**base, "verify_nodes": (0, 1, 16), "verify_s": (0.1, 0.35, 1.1)})) == TreeSize(8, 8)
    assert probe_tree(inputs(**{**base, "verify_nodes": (0, 1, 16), "verify_s": (0.1, 0.65, 1.4)})) == PLAIN


def test_a_new_generation_keeps_the_rates_at_the_weight_of_a_few_verdicts():
    est = LoopEstimates()
    chain = DraftTree.chain([1, 2, 3])
    for _ in range(30):
        est.observe_verdict(chain, 3, round_trip_s=0.1, server_s=0.05)  # every depth accepted
    before = est.acceptance()
    assert before[0] > 0.9
    est.new_generation()
    assert est.reached[0] == pytest.approx(est.CARRY)
    after = est.acceptance()  # a client serving similar prompts starts near where it was (the prior pulls a little)
    assert after[0] > 0.85 and after[1] > 0.9
    for _ in range(3):
        est.observe_verdict(chain, 0, round_trip_s=0.1, server_s=0.05)  # the new prompt: depth 1 refused
    assert est.acceptance()[0] < 0.5  # three verdicts on it outweigh the thirty before


def test_depths_the_text_no_longer_reaches_fall_back_to_their_prior():
    """Code's deep acceptance must not outlive it: a depth no verdict reaches any more fades to the depth
    before it (main kept depth 3 at code's rate however long the chat went on)."""
    est = LoopEstimates()
    chain = DraftTree.chain([1, 2, 3, 4])
    for _ in range(30):
        est.observe_verdict(chain, 4, round_trip_s=0.1, server_s=0.05)
    for _ in range(50):
        est.observe_verdict(chain, 1, round_trip_s=0.1, server_s=0.05)  # depth 1 accepted, depth 2 refused
    rates = est.acceptance()
    assert rates[0] > 0.9 and rates[1] < 0.15
    assert rates[2] < 0.25 and rates[3] < 0.25  # back toward depth 2's rate, not code's ~1.0


def test_loop_config_says_what_is_wrong():
    with pytest.raises(ValueError, match="auto"):
        LoopConfig(tree="big")
    with pytest.raises(ValueError, match="explore_share >= 0"):
        LoopConfig(explore_share=-0.1)


def test_loops_by_flag(capsys):
    import argparse

    from edgespec.client.cli import add_loop_arguments, loop_config

    p = argparse.ArgumentParser()
    add_loop_arguments(p)
    assert loop_config(p.parse_args([])) == LoopConfig()  # the CLI's default: auto, pipelined
    assert loop_config(p.parse_args(["--no-pipeline", "--tree", "fixed"])) == LoopConfig(pipeline=False, tree="fixed")
    assert loop_config(p.parse_args(["--decode-ahead", "1"])) == LoopConfig(decode_ahead=1)
    for bad in ("0", "65", "two"):
        with pytest.raises(SystemExit):
            p.parse_args(["--decode-ahead", bad])
    assert "not a number of tokens from 1 to 64" in capsys.readouterr().err


def test_auto_keeps_the_drafters_shape_until_enough_trees_are_measured():
    """A prior alone must not settle the loop on plain steps: the first trees are the drafter's own shape."""
    est = LoopEstimates((0, 4), (0.1, 10.0))  # trees look ruinous on this curve
    chain = DraftTree.chain([1, 2])
    auto = TreePlanner(LoopConfig(warmup_trees=3, explore_every=100, queue_plain=False), est, 255, can_pipeline=False)
    sizes = []
    for _ in range(5):
        size = auto.size(40)
        sizes.append(size)
        if not size.plain:
            est.observe_draft(chain, 0.01)
            est.observe_verdict(chain, 0, round_trip_s=10.1, server_s=10.0)
    # then plain steps, each asking the target for several tokens (the round trip is as long as a decode step)
    assert sizes[:3] == [TreeSize(255, 39)] * 3 and all(s.plain and s.ahead > 1 for s in sizes[3:])


def test_a_low_hit_rate_drifts_back_so_drafting_ahead_is_tried_again():
    est = LoopEstimates()
    for _ in range(10):
        est.observe_guess(False)
    low = est.hit_rate
    assert low < 0.05
    for _ in range(10):
        est.observe_no_guess()
    assert low < est.hit_rate < est.PRIOR_HIT_RATE


def test_a_tree_that_fits_the_flight_is_drafted_ahead_whatever_the_hit_rate():
    """Code on a CPU: a 12-level tree takes 1.3 s to draft, a verification 0.5 s. Where a verdict that rules a
    tree out does not stop it, at the prior hit rate a full tree drafted ahead would delay the verdict more than
    it saves; a 3-level one is done before the verdict (0.5 s / 0.1 s a pass, less the bonus level and the
    root's pass), so it is drafted and its hit measured. Where it stops (the default), every guess is drafted
    in full: a miss costs at most the pass under way."""
    est = LoopEstimates((0, 64), (0.5, 0.5))
    est.observe_verdict(DraftTree.chain(range(12)), 12, 0.5, 0.5)  # no link: the round trip is the server's
    est.observe_draft(DraftTree.chain(range(12)), 1.3)  # 0.1 s a pass
    assert TreePlanner(LoopConfig(), est, 64, can_pipeline=True).worth_drafting_ahead(12, 12, 0.0, first=False)
    planner = TreePlanner(LoopConfig(stop_missed=False), est, 64, can_pipeline=True)
    assert not planner.worth_drafting_ahead(12, 12, 0.0, first=True)
    assert planner.depth_within_flight(12, 0.0) == 3
    assert planner.depth_within_flight(12, 0.3) == 0  # the verdict is nearly here
    assert TreePlanner(LoopConfig(pipeline=False), est, 64, can_pipeline=True).depth_within_flight(12, 0.0) == 0


def test_a_plain_step_decodes_ahead_enough_tokens_to_hide_the_round_trip():
    """The fewest tokens that keep the round trip at most ahead_overhead of the step, capped by max_ahead."""
    cpu = inputs(round_trip_s=0.05, verify_s=(0.59, 2.0, 4.0), max_ahead=8)  # 5g to a one-core CPU server
    assert plain_step(cpu) == TreeSize(0, 0, 1)  # 0.05 s is under 10 % of one 0.59 s decode step
    four_g = inputs(round_trip_s=0.28, verify_s=(0.5, 2.0, 4.0), max_ahead=8)  # 4g's 0.78 s a plain step
    assert plain_step(four_g) == TreeSize(0, 0, 6)  # 0.28 <= 0.1 x (0.28 + 6 x 0.5), not at 5
    gpu = inputs(round_trip_s=0.04, verify_s=(0.02, 0.025, 0.03), max_ahead=8)
    assert plain_step(gpu) == TreeSize(0, 0, 8)  # would want 18: capped
    assert plain_step(inputs(round_trip_s=0.04, verify_s=(0.02, 0.025, 0.03))) == PLAIN  # max_ahead 1: as before
    # tokens per second of a plain step: k tokens for one round trip and k decode steps
    assert tokens_per_s(four_g, plain_step(four_g)) == pytest.approx(6 / (0.28 + 6 * 0.5))
    assert step_time(four_g, TreeSize(0, 0, 3)) == pytest.approx(0.28 + 3 * 0.5)
    with pytest.raises(ValueError, match="max_ahead >= 1"):
        inputs(max_ahead=0)


def test_decoding_ahead_makes_plain_steps_win_where_a_round_trip_a_token_lost():
    """4g to a CPU server with a drafter right half the time: a 4-node tree beats one token a round trip, and
    loses to plain steps of 6 tokens each."""
    over = dict(round_trip_s=0.28, verify_nodes=(0, 4, 16), verify_s=(0.5, 1.0, 2.0), acceptance=(0.5,),
                nodes_per_depth=1.0, draft_pass_s=0.02, max_depth=4)
    assert not plan_tree(inputs(**over, max_ahead=1)).plain
    assert plan_tree(inputs(**over, max_ahead=8)) == TreeSize(0, 0, 6)


def test_estimates_keep_one_decode_step_of_a_plain_step_that_decoded_ahead():
    est = LoopEstimates()
    est.observe_verdict(DraftTree((), ()), 0, round_trip_s=0.1 + 8 * 0.05, server_s=8 * 0.05, decoded=8)
    assert est.curve()[0] == pytest.approx(0.05) and est.round_trip_s == pytest.approx(0.1)
    planner = TreePlanner(LoopConfig(warmup_trees=0, decode_ahead=4, queue_plain=False), est, 16,
                          can_pipeline=False)
    est.observe_draft(DraftTree.chain([1, 2]), 0.01)
    est.observe_verdict(DraftTree.chain([1, 2]), 0, round_trip_s=5.1, server_s=5.0)  # trees: ruinous
    assert planner.size(40) == TreeSize(0, 0, 4)  # capped by LoopConfig.decode_ahead
    assert planner.size(3) == TreeSize(0, 0, 3)  # and by the tokens still wanted
    with pytest.raises(ValueError, match="decode_ahead"):
        LoopConfig(decode_ahead=0)


def test_queued_plain_steps_decode_just_long_enough_to_cover_the_round_trip():
    """Queued behind the step before, a plain step's round trip runs while that one decodes: it asks for the
    fewest tokens whose decoding outlasts the round trip, and costs the longer of the two, not their sum."""
    base = dict(round_trip_s=0.6, verify_nodes=(0, 8), verify_s=(0.25, 0.5), draft_pass_s=0.1, acceptance=(0.1,),
                nodes_per_depth=1.0, max_nodes=8, max_depth=4, max_ahead=8)
    queued, unqueued = PlanInputs(**base, queue_plain=True), PlanInputs(**base)
    assert plain_step(queued) == TreeSize(0, 0, 4)  # 4 x 0.25 s covers 1.5 x 0.6 s (QUEUE_MARGIN)
    assert step_time(queued, plain_step(queued)) == pytest.approx(1.0)
    assert tokens_per_s(queued, plain_step(queued)) == pytest.approx(4.0)  # the server never waits: 1 / decode
    assert plain_step(unqueued) == TreeSize(0, 0, 8)  # one round trip a step: as many as allowed
    assert tokens_per_s(unqueued, plain_step(unqueued)) == pytest.approx(8 / 2.6)
    fast_link = PlanInputs(**{**base, "round_trip_s": 0.01}, queue_plain=True)
    assert plain_step(fast_link) == TreeSize(0, 0, 1)  # a token at a time costs nothing when the link is short
    assert plan_tree(fast_link).plain  # this drafter's trees lose either way


def satellite(**over) -> PlanInputs:
    """This box's bf16 server behind a satellite link (the debug log of a satellite run, 2026-11-29): a 0.33 s
    decode step, trees of 4-32 nodes 0.37-0.52 s, a 0.58 s link, 0.045 s drafter passes; prose acceptance."""
    base = dict(round_trip_s=0.58, verify_nodes=(0, 4, 16, 32), verify_s=(0.33, 0.371, 0.419, 0.517),
                draft_pass_s=0.045, acceptance=(0.8, 0.75, 0.75, 0.65), nodes_per_depth=2.0, max_nodes=32,
                max_depth=16, hit_rate=0.3, max_ahead=8, queue_plain=True, stop_missed=True)
    return PlanInputs(**{**base, **over})


def test_a_switch_to_plain_steps_costs_the_round_trip_the_queue_no_longer_hides():
    plain = plain_step(satellite())
    assert plain == TreeSize(0, 0, 3)  # 3 x 0.33 s covers 1.5 x 0.58 s
    assert switch_cost(satellite(), plain) == pytest.approx(0.58)
    assert switch_cost(satellite(queue_plain=False), plain) == 0.0  # each plain step pays its round trip anyway


def test_a_switch_to_trees_costs_the_first_trees_drafting_ahead():
    tree = TreeSize(8, 4)
    serial = step_time(satellite(hit_rate=0.0), tree)
    assert switch_cost(satellite(), tree) == pytest.approx(serial - step_time(satellite(), tree))
    assert switch_cost(satellite(), tree) > 0
    assert switch_cost(satellite(hit_rate=0.0), tree) == 0.0  # nothing drafted ahead: nothing lost


def test_a_switch_pays_only_when_the_other_kind_wins_by_more_than_it_costs_over_the_horizon():
    inp = satellite()
    plain, tree = plain_step(inp), best_tree(inp)
    assert tree is not None and plan_tree(inp) in (plain, tree)
    gap = tokens_per_s(inp, plain) / tokens_per_s(inp, tree)
    assert gap > 1.0  # plain steps' steady rate wins here ...
    assert not switch_pays(inp, tree, plain, horizon=8)  # ... by less than a round trip over 8 steps: stay in trees
    assert switch_pays(inp, tree, plain, horizon=10_000)  # spread thin enough, the steady rates decide
    worse = satellite(acceptance=(0.5,))  # a drafter that is mostly wrong: plain steps win by far
    assert switch_pays(worse, best_tree(worse), plain_step(worse), horizon=8)
    # the other way: from plain steps into trees that win by far, the first tree's lost drafting ahead is small
    code = satellite(acceptance=(0.98,))
    assert switch_pays(code, plain_step(code), best_tree(code), horizon=8)


def test_best_tree_is_the_planned_tree_and_none_when_nothing_fits():
    inp = satellite(acceptance=(0.98,))
    assert plan_tree(inp) == best_tree(inp) != PLAIN
    assert best_tree(satellite(max_depth=0)) is None
    assert plan_tree(satellite(max_depth=0)).plain


def test_the_planner_keeps_the_kind_of_step_it_is_on_where_a_switch_would_not_pay():
    """Estimates near the break-even (plain steps a little ahead): a loop on trees keeps its trees, one on plain
    steps keeps them; with settle off, both follow the steady rates."""
    est = LoopEstimates((0, 4, 16, 32), (0.33, 0.371, 0.419, 0.517))
    tree = DraftTree((1, 2, 3, 4, 5, 6, 7, 8), (ROOT, 0, 1, 2, ROOT, 4, 5, 6))
    for i in range(12):
        est.observe_draft(tree, 0.045 * 5)
        est.observe_verdict(tree, (2, 2, 3)[i % 3], round_trip_s=0.58 + 0.39, server_s=0.39)
        est.observe_guess(False)
    inp = est.inputs(32, 16, True, 8, queue_plain=True, stop_missed=True)
    assert plan_tree(inp).plain and not switch_pays(inp, best_tree(inp), plain_step(inp), 8)
    for settle, kept in ((True, True), (False, False)):
        planner = TreePlanner(LoopConfig(settle=settle, warmup_trees=0), est, 32, can_pipeline=True)
        planner.last_plain = False  # on trees ...
        planner._plain_in_a_row, planner._plain_s = 0, 0.0  # ... and not due a probe (a new planner probes first)
        assert (not planner.size(100).plain) is kept
        assert (not planner.size(100, explore=False).plain) is kept  # drafted ahead while a tree is out


def test_the_servers_load_price_shrinks_trees_and_alone_changes_nothing():
    def planned(row_cost_s: float, sharing: float) -> TreeSize:
        est = LoopEstimates((0, 16, 64), (0.05, 0.06, 0.09))
        chain = DraftTree.chain(list(range(8)))
        for _ in range(30):
            est.observe_draft(chain, 0.008)
            est.observe_verdict(chain, 5, round_trip_s=0.1, server_s=0.06)
            est.observe_load(row_cost_s, sharing)
        return plan_tree(est.inputs(64, 12, pipelined=False))

    alone, unknown = planned(0.002, 1.0), planned(0.0, 0.0)
    assert alone == unknown and alone.nodes > 0  # sharing 1 (or a server that does not say): as before
    busy, full = planned(0.002, 8.0), planned(0.002, 64.0)
    assert 0 < busy.nodes < alone.nodes and full.nodes < busy.nodes  # the fuller the server, the smaller the trees
    assert full == PLAIN or full.nodes <= 2


def _measured(curve_nodes, curve_s, round_trip_s: float) -> LoopEstimates:
    """Estimates of a drafter whose trees were all rejected, on a server of this curve and link."""
    est = LoopEstimates(curve_nodes, curve_s)
    chain = DraftTree.chain([1, 2, 3, 4])
    for _ in range(10):
        est.observe_draft(chain, 0.05)
        est.observe_verdict(chain, 0, round_trip_s=round_trip_s + curve_s[-1], server_s=curve_s[-1])
    return est


def test_a_copy_replaces_a_plain_step_where_its_tokens_pay_for_its_verification():
    """A one-core CPU server (a decode step 0.45 s, a 12-node tree ~1.4 s, 5g): a 12-token copy at the copies'
    prior acceptance commits ~4.7 tokens for about three decode steps' time; a copy of one token does not pay,
    nor does any copy against a GPU server that decodes 8 tokens in a round trip. Copies that the target
    refuses lower the copies' rate, not the drafter's, until they no longer pay."""
    cpu = _measured((0, 1, 16), (0.45, 0.9, 1.5), round_trip_s=0.05)
    planner = TreePlanner(LoopConfig(), cpu, 16, can_pipeline=True)
    long_copy, short_copy = DraftTree.chain(list(range(12))), DraftTree.chain([7])
    assert cpu.copy_acceptance() == pytest.approx(LoopEstimates.COPY_PRIOR)
    assert planner.copy_pays(long_copy, remaining=64) and not planner.copy_pays(short_copy, remaining=64)
    gpu = _measured((0, 1, 16), (0.006, 0.006, 0.007), round_trip_s=0.04)
    assert not TreePlanner(LoopConfig(), gpu, 16, can_pipeline=True).copy_pays(long_copy, remaining=64)
    assert not TreePlanner(LoopConfig(), LoopEstimates(), 16, True).copy_pays(long_copy, 64)  # nothing measured

    before, verified = cpu.acceptance(), cpu.trees_verified
    for _ in range(3):
        cpu.observe_verdict(long_copy, 0, round_trip_s=1.45, server_s=1.4, copy=True)
    assert cpu.copy_acceptance() < 0.4
    assert cpu.acceptance() == before and cpu.trees_verified == verified
    assert not planner.copy_pays(long_copy, remaining=64)
    for _ in range(10):
        cpu.observe_verdict(long_copy, 12, round_trip_s=1.45, server_s=1.4, copy=True)
    assert cpu.copy_acceptance() > 0.9 and planner.copy_pays(long_copy, remaining=64)
