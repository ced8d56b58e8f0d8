"""A verdict's rules: guessing it from a drafter's scores and the tree a right guess sends; what it commits
(the accepted path checked, a Resume's commit) and where the output ends."""
from __future__ import annotations

import math

import pytest

from edgespec.client.loop.verdict import (Finish, ProtocolError, StopStrings, accepted_path, finish_point,
                                         likely_outcomes, may_still_hit, resume_commit, tree_after)
from edgespec.shared.wire import ResumePolicy
from edgespec.shared.tree import ROOT, DraftTree


def test_the_likeliest_end_of_the_accepted_path():
    # root -> a (0.9) -> b (0.8) -> c (0.1); root -> d (0.05)
    tree = DraftTree((10, 11, 12, 13), (ROOT, 0, 1, ROOT))
    scores = [math.log(p) for p in (0.9, 0.8, 0.1, 0.05)]
    out = likely_outcomes(tree, scores, 3)
    assert out[0].path == (0, 1) and out[0].probability == pytest.approx(0.7)
    assert {o.path for o in out[1:]} == {(0, 1, 2), (0,)}  # 0.1 each
    assert likely_outcomes(tree, scores, 3, min_probability=0.2) == out[:1]
    with pytest.raises(ValueError):
        likely_outcomes(tree, scores[:2], 1)


def test_tree_after_the_bonus_token():
    # drafted ahead: root -> x(0) -> y(1) -> z(3); root -> w(2) -> v(4)
    tree = DraftTree((5, 6, 7, 8, 9), (ROOT, 0, ROOT, 1, 2))
    scores = [-0.1, -0.3, -1.0, -0.6, -1.5]
    sub, sub_scores = tree_after(tree, scores, [5], 8)
    assert sub == DraftTree((6, 8), (ROOT, 0)) and sub_scores == pytest.approx([-0.2, -0.5])
    assert tree_after(tree, scores, [7], 8)[0] == DraftTree((9,), (ROOT,))
    assert tree_after(tree, scores, [5], 1)[0] == DraftTree((6,), (ROOT,))  # capped, still connected
    assert tree_after(tree, scores, [6], 8) is None  # 6 is not a depth-1 node: the guess missed
    with pytest.raises(ValueError):
        tree_after(tree, scores, [], 8)


def test_tree_after_a_verdict_that_accepted_more_than_the_guess():
    # the target accepted one token past the guessed path (5), then its bonus (8): what is below 5 -> 6 -> 8
    tree = DraftTree((5, 6, 7, 8, 9, 4), (ROOT, 0, ROOT, 1, 2, 3))
    scores = [-0.1, -0.3, -1.0, -0.6, -1.5, -0.7]
    sub, sub_scores = tree_after(tree, scores, [5, 6, 8], 8)
    assert sub == DraftTree((4,), (ROOT,)) and sub_scores == pytest.approx([-0.1])
    assert tree_after(tree, scores, [5, 6, 8, 4], 8)[0] == DraftTree((), ())  # nothing below: a miss to the loop
    assert tree_after(tree, scores, [5, 7], 8) is None  # 7 is not below 5
    assert tree_after(tree, scores, [7, 9], 8)[0] == DraftTree((), ())


def test_ngram_scores_are_its_match_shares():
    from edgespec.client.drafters.base import DraftRequest
    from edgespec.client.drafters.ngram import NgramConfig, NgramDrafter

    drafter = NgramDrafter(NgramConfig(max_ngram=2, min_ngram=2, max_continuation=3))
    # "1 2" was followed by "3 4 5" twice and by "3 9 9" once
    context = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 9, 0, 1, 2]
    tree = drafter.propose(DraftRequest(context, 24, 8))
    p = {tuple(tree.tokens[i] for i in tree.ancestors(n)): math.exp(s)
         for n, s in enumerate(drafter.tree_scores())}
    assert p[(3,)] == pytest.approx(1.0) and p[(3, 4, 5)] == pytest.approx(2 / 3) and p[(3, 9)] == pytest.approx(1 / 3)
    best = likely_outcomes(tree, drafter.tree_scores(), 1)[0]
    assert [tree.tokens[i] for i in best.path] == [3, 4, 5]  # the path most matches follow, to its end


def test_may_still_hit_follows_the_verdict_through_the_candidates():
    flight = DraftTree((5, 6, 3), (ROOT, 0, 1))  # 5 -> 6 -> 3
    # drafted ahead after the guessed path (0,) = [5]: bonus guesses 6 and 7; 6 expanded into 8 and 9; 7 not yet
    ahead = DraftTree((6, 7, 8, 9), (ROOT, ROOT, 0, 0))
    assert may_still_hit(ahead, (0,), flight, (0,), 7)  # bonus 7: there, not expanded yet
    assert may_still_hit(ahead, (0,), flight, (0, 1), 8)  # accepted 6 past the guess, then 8: there
    assert not may_still_hit(ahead, (0,), flight, (0, 1), 4)  # 6 was expanded without 4
    assert not may_still_hit(ahead, (0,), flight, (0,), 4)  # the bonus guesses are all there from the start
    assert not may_still_hit(ahead, (0,), flight, (), 5)  # the guessed path was not accepted
    assert not may_still_hit(ahead, (0,), flight, (0, 1, 2), 1)  # 6 was expanded without 3
    deeper = DraftTree((5, 6, 8, 3), (ROOT, 0, 1, 1))  # the flight 5 -> 6 -> {8, 3}
    assert may_still_hit(ahead, (0,), deeper, (0, 1, 2), 4)  # 6 -> 8, then 8 is not expanded yet
    assert not may_still_hit(DraftTree((), ()), (), DraftTree((), ()), (), 4)  # nothing drafted: nothing matches


# ------------------------------------------------------------------ what a verdict commits
TREE = DraftTree((10, 11, 12, 13), (ROOT, 0, 0, ROOT))


def test_accepted_path_checks_it_is_a_path():
    assert accepted_path(TREE, [0, 2]) == [10, 12]
    assert accepted_path(TREE, []) == []
    with pytest.raises(ProtocolError, match="not a root-to-leaf path"):
        accepted_path(TREE, [1])
    with pytest.raises(ProtocolError, match="not a root-to-leaf path"):
        accepted_path(TREE, [0, 3])
    with pytest.raises(ProtocolError, match="node 9"):
        accepted_path(TREE, [9])


def test_resume_commit_keep_and_rollback():
    committed = [1, 2, 3, 50, 51, 52]  # 3 confirmed, 3 provisional
    assert resume_commit(committed, 3, 1, 99, ResumePolicy.ROLLBACK) == [1, 2, 3, 50, 99]
    assert resume_commit(committed, 3, 1, 99, ResumePolicy.KEEP) == [1, 2, 3, 50, 51, 52, 99]
    assert resume_commit(committed, 3, 3, 99, ResumePolicy.ROLLBACK) == committed + [99]
    assert resume_commit([1, 2, 3], 3, 0, 7, ResumePolicy.ROLLBACK) == [1, 2, 3, 7]
    with pytest.raises(ProtocolError, match="agreed with 4 of 3"):
        resume_commit(committed, 3, 4, 99, ResumePolicy.KEEP)


def test_finish_point_eos_length_stop():
    eos = {0}
    assert finish_point([5, 6, 0, 7], 0, eos, 10) == Finish(3, "stop")
    assert finish_point([5, 6, 0, 7], 0, eos, 10, ignore_eos=True) == Finish(4, None)
    assert finish_point([5, 6, 7, 8], 0, eos, 3) == Finish(3, "length")
    assert finish_point([5, 6], 0, eos, 2) == Finish(2, "length")
    assert finish_point([5, 6], 0, eos, 5) == Finish(2, None)
    decode = lambda ids: "".join(chr(96 + t) for t in ids)  # 1 -> a, 2 -> b, ...
    assert finish_point([1, 2, 3, 4], 0, eos, 10, StopStrings(decode, ["bc"])) == Finish(3, "stop")
    assert finish_point([1, 2, 3, 4], 0, eos, 10, StopStrings(decode, ["zz"])) == Finish(4, None)
    # tokens before `checked` were looked at already
    assert finish_point([0, 5, 6], 1, eos, 10) == Finish(3, None)


def test_stop_strings_are_fed_a_token_at_a_time_and_start_again_after_a_rollback():
    calls = []

    def decode(ids):
        calls.append(len(ids))
        return "".join(chr(96 + t) for t in ids)

    stops = StopStrings(decode, ["cd", "xyz"])
    text = [1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12]  # abcefghijkl: no stop
    assert finish_point(text, 0, set(), 100, stops) == Finish(len(text), None)
    assert max(calls) < 8  # a bounded window per token, not the whole text
    # a rollback replaced everything from index 3 on: "abc" + "d" completes "cd"
    assert finish_point([1, 2, 3, 4, 5], 3, set(), 100, stops) == Finish(4, "stop")
    # the stop completes over two verifications: "xy" then "z"
    stops = StopStrings(decode, ["cd", "xyz"])
    assert finish_point([24, 25], 0, set(), 100, stops) == Finish(2, None)
    assert finish_point([24, 25, 26, 1], 2, set(), 100, stops) == Finish(3, "stop")
