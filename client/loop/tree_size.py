"""The size of each step's tree: the one that maximises expected committed tokens per second. Pure.

A step with a tree of depth D commits, in expectation, 1 + sum over i <= D of the
chance that depth i is accepted (the bonus token is always there); the chance
of depth i is the product of the drafter's per-depth acceptance up to i. It
costs the drafter's time for the tree, the link's round trip and the server's
verification of its nodes (the cost curve the server measured, refined by the
timings of each answer). A step with no tree ("none", a plain step through the
session) asks the target to decode k tokens on its own (``Draft.decode_ahead``):
it commits k tokens for one round trip and k decode steps, with k the fewest
that keep the round trip under a set share of the step (one round trip a token
lost to the plain API's stream at 4g: 0.78 s a token against 0.50); in the
pipelined loop plain steps in a row are queued, each sent before the answer to
the one before, so a step costs the longer of its round trip and its decoding,
and k is the fewest whose decoding covers the round trip with a margin. Drafting
ahead (``verdict.py``) hides the drafting behind the verification of the
previous tree when its guess was right: a cycle then costs
max(draft, round trip + verify), the draft one level deeper (its bonus level); a
wrong guess stops its drafting at the verdict and costs the round trip,
the verification and the drafting after it, as a serial cycle (before
misses stopped, they cost max(draft, round trip + verify) plus the
drafting again).
The planner compares every depth up to the limit and keeps the best; the node
count follows from the depth by the drafter's own nodes per level. That depth
is what the *average* acceptance pays for; a tree's own paths say more: on a
confident stretch its best path stays likely for many levels, on an unsure one
it falls off at once. ``path_floors`` turns the same costs into a stopping rule
per tree: one more level adds at most the best frontier path's probability in
expected tokens, and costs what the step's time grows by with it, so it pays
while that probability is at least the planned rate times that growth
(EAGLE-2's min_prob, with the threshold from the loop's costs).
Steady rates are not the whole cost: leaving trees for plain steps loses the
queue for one round trip, and leaving plain steps for trees loses the first
tree's drafting ahead (``switch_cost``); ``switch_pays`` spreads that over a
few steps before a loop changes kinds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence


@dataclass(frozen=True)
class TreeSize:
    """What one step asks the drafter for."""

    nodes: int  # most nodes in the tree (0: no tree, a plain step)
    depth: int  # deepest level (0: no tree)
    ahead: int = 1  # a plain step: the tokens the target decodes on its own (Draft.decode_ahead)
    floors: tuple[float, ...] = field(default=(), compare=False)  # [i]: the least probability the best path of
    # depth i + 1 must have for drafting a level deeper to pay (``path_floors``); (): the drafter's own min_prob

    @property
    def plain(self) -> bool:
        return self.nodes == 0 or self.depth == 0


PLAIN = TreeSize(0, 0)


@dataclass(frozen=True)
class PlanInputs:
    """Costs and acceptance, as measured; every time in seconds."""

    round_trip_s: float  # the link's share of one Draft's round trip (the server's own time excluded)
    verify_nodes: tuple[int, ...]  # the server's cost curve: tree sizes, ascending (0 = a decode step) ...
    verify_s: tuple[float, ...]  # ... and its time on a Draft of each size
    draft_pass_s: float  # the drafter's time per level of depth (a tree of depth D takes D + 1 passes)
    acceptance: tuple[float, ...]  # [i]: chance that depth i + 1 is accepted once depth i was (the root is)
    nodes_per_depth: float  # nodes the drafter's trees hold per level of depth
    max_nodes: int  # largest tree allowed (the server's limit, the drafter's shape)
    max_depth: int  # deepest tree allowed (also: the tokens still wanted)
    hit_rate: float = 0.0  # share of trees drafted ahead while the previous verification was out (0: serial)
    max_ahead: int = 1  # most tokens a plain step may ask the target to decode (also: at most the tokens wanted)
    ahead_overhead: float = 0.1  # a plain step asks for the fewest tokens that keep the round trip at most this
    # share of its time (more only delay the next tree's chance and the output's next piece)
    queue_plain: bool = False  # plain steps in a row go out before the answer to the one before (Draft.queued):
    # the round trip overlaps the decoding
    stop_missed: bool = False  # a tree drafted ahead stops once its verdict rules it out (LoopConfig.stop_missed):
    # a miss then costs the drafting after the verdict alone, and a tree drafted ahead is charged its bonus level

    def __post_init__(self) -> None:
        if len(self.verify_nodes) != len(self.verify_s) or not self.verify_nodes:
            raise ValueError(f"the cost curve needs as many times as sizes, and at least one: "
                             f"{self.verify_nodes} / {self.verify_s}")
        if list(self.verify_nodes) != sorted(set(self.verify_nodes)):
            raise ValueError(f"the cost curve's sizes must ascend without repeats, got {self.verify_nodes}")
        if not 0.0 <= self.hit_rate <= 1.0 or any(not 0.0 <= a <= 1.0 for a in self.acceptance):
            raise ValueError("hit_rate and acceptance are chances, between 0 and 1")
        if self.max_ahead < 1 or not 0.0 < self.ahead_overhead < 1.0:
            raise ValueError(f"need max_ahead >= 1 and 0 < ahead_overhead < 1, got {self.max_ahead} and "
                             f"{self.ahead_overhead}")


def verify_time(nodes: int, curve_nodes: Sequence[int], curve_s: Sequence[float]) -> float:
    """The cost curve at ``nodes``: linear between measured sizes, the last slope beyond them, flat below."""
    if len(curve_nodes) == 1 or nodes <= curve_nodes[0]:
        return curve_s[0]
    for k in range(1, len(curve_nodes)):
        if nodes <= curve_nodes[k] or k == len(curve_nodes) - 1:
            n0, n1, s0, s1 = curve_nodes[k - 1], curve_nodes[k], curve_s[k - 1], curve_s[k]
            return max(0.0, s0 + (s1 - s0) * (nodes - n0) / (n1 - n0))
    raise AssertionError("unreachable")


def expected_tokens(acceptance: Sequence[float], depth: int) -> float:
    """Tokens one step commits on average with a tree of ``depth`` levels: the bonus token plus each depth's
    chance of acceptance (depths past the measured ones keep the last measured rate)."""
    total, reach = 1.0, 1.0
    for i in range(depth):
        rate = acceptance[i] if i < len(acceptance) else (acceptance[-1] if acceptance else 0.0)
        reach *= rate
        total += reach
    return total


def tree_nodes(inputs: PlanInputs, depth: int) -> int:
    return 0 if depth == 0 else max(depth, min(inputs.max_nodes, math.ceil(inputs.nodes_per_depth * depth)))


# A queued plain step decodes for this many round trips: round trips vary (the satellite profile's pareto tail;
# at exactly one, the server idled on most steps there), and a longer step costs nothing but a coarser stream.
QUEUE_MARGIN = 1.5


def plain_step(inputs: PlanInputs) -> TreeSize:
    """The plain step: the fewest tokens decoded ahead (up to max_ahead) that keep the round trip at most
    ahead_overhead of the step's time; queued, the fewest whose decoding outlasts QUEUE_MARGIN round trips (the
    next step then reaches the server before it runs out of work)."""
    decode = verify_time(0, inputs.verify_nodes, inputs.verify_s)
    share = inputs.ahead_overhead
    if decode <= 0:
        wanted = inputs.max_ahead
    elif inputs.queue_plain:
        wanted = math.ceil(QUEUE_MARGIN * inputs.round_trip_s / decode)
    else:  # round trip <= share * (round trip + k * decode)  <=>  k >= round trip * (1 - share) / (share * decode)
        wanted = math.ceil(inputs.round_trip_s * (1 - share) / (share * decode))
    return TreeSize(0, 0, max(1, min(inputs.max_ahead, wanted)))


def step_time(inputs: PlanInputs, size: TreeSize) -> float:
    """Seconds one step costs, the better of drafting serially and drafting ahead at the measured hit rate."""
    if size.plain:
        decoding = size.ahead * verify_time(0, inputs.verify_nodes, inputs.verify_s)
        # queued behind the step before, its round trip runs while that one decodes
        return max(inputs.round_trip_s, decoding) if inputs.queue_plain else inputs.round_trip_s + decoding
    flight = inputs.round_trip_s + verify_time(size.nodes, inputs.verify_nodes, inputs.verify_s)
    draft = inputs.draft_pass_s * (size.depth + 1)
    if not inputs.stop_missed:
        ahead = max(draft, flight) + (1.0 - inputs.hit_rate) * draft
        return min(draft + flight, ahead)
    # Drafted ahead, a tree has one level more (its first guesses the bonus token, DraftPipeline._draft_for); a
    # hit sends it once both it and the verdict are there; a miss stops it at the verdict and drafts anew.
    hit = max(draft + inputs.draft_pass_s, flight)
    ahead = inputs.hit_rate * hit + (1.0 - inputs.hit_rate) * (flight + draft)
    return min(draft + flight, ahead)


def tokens_per_s(inputs: PlanInputs, size: TreeSize) -> float:
    tokens = size.ahead if size.plain else expected_tokens(inputs.acceptance, size.depth)
    return tokens / max(step_time(inputs, size), 1e-9)


def best_tree(inputs: PlanInputs) -> TreeSize | None:
    """The tree size with the most expected committed tokens per second (on a tie the smaller); None when no
    tree fits."""
    best, best_rate = None, 0.0
    for depth in range(1, max(0, inputs.max_depth) + 1):
        size = TreeSize(tree_nodes(inputs, depth), depth)
        if size.nodes > inputs.max_nodes:
            break
        rate = tokens_per_s(inputs, size)
        if best is None or rate > best_rate * (1 + 1e-9):
            best, best_rate = size, rate
    return best


def plan_tree(inputs: PlanInputs) -> TreeSize:
    """The tree size (or the plain step) with the most expected committed tokens per second; on a tie the
    smaller (the plain step first)."""
    plain, tree = plain_step(inputs), best_tree(inputs)
    if tree is not None and tokens_per_s(inputs, tree) > tokens_per_s(inputs, plain) * (1 + 1e-9):
        return tree
    return plain


def switch_cost(inputs: PlanInputs, to: TreeSize) -> float:
    """Seconds a switch to `to`'s kind of step costs on top of that kind's steady steps. To plain steps: the
    first cannot be queued behind a tree (it hangs from the verdict), so its round trip is not hidden behind
    the step before it. To trees: nothing is drafted ahead behind a plain step (it has no tree to guess a
    verdict of), so the first tree is drafted after the answer, as in the serial loop."""
    if to.plain:
        return inputs.round_trip_s if inputs.queue_plain else 0.0
    serial = replace(inputs, hit_rate=0.0)
    return max(0.0, step_time(serial, to) - step_time(inputs, to))


def switch_pays(inputs: PlanInputs, current: TreeSize, other: TreeSize, horizon: int) -> bool:
    """Does leaving `current`'s kind of step (plain, or trees) for `other` pay, once the switch (``switch_cost``)
    is spread over `horizon` steps of the other kind? The planner otherwise compares steady rates, and on a
    long link where trees and plain steps come close (prose at satellite delays: both ~2.7 tokens/s on a
    one-core CPU server) each swing of its estimates cost an idle round trip or a tree drafted serially."""
    tokens = other.ahead if other.plain else expected_tokens(inputs.acceptance, other.depth)
    rate = horizon * tokens / max(horizon * step_time(inputs, other) + switch_cost(inputs, other), 1e-9)
    return rate > tokens_per_s(inputs, current) * (1 + 1e-9)


def path_floors(inputs: PlanInputs, planned: TreeSize, calibration: float = 1.0) -> tuple[float, ...]:
    """[i]: the least probability the best path of depth i + 1 must have for drafting one level deeper to pay,
    for i + 1 < max_depth: the rate the planned size is expected to commit at times what one level more adds to
    a step's time (drafting, and verifying the nodes it adds; while drafting ahead hides a level on a hit, a
    level costs only on misses). A level adds at most that path's probability in expected tokens (each path's
    children are at most as likely as it is), times ``calibration``: the tokens the target accepts for each one
    the drafter's probabilities promise (``LoopEstimates.calibration``)."""
    if calibration <= 0:
        raise ValueError(f"calibration must be positive, got {calibration}")
    rate = tokens_per_s(inputs, planned) / calibration
    floors: list[float] = []
    before = step_time(inputs, TreeSize(tree_nodes(inputs, 1), 1))
    for depth in range(2, max(0, inputs.max_depth) + 1):
        after = step_time(inputs, TreeSize(min(inputs.max_nodes, tree_nodes(inputs, depth)), depth))
        floors.append(min(1.0, rate * max(0.0, after - before)))
        before = after
    return tuple(floors)


def probe_tree(inputs: PlanInputs) -> TreeSize:
    """The shallowest tree that would beat plain steps were the drafter right on every node (PLAIN when none
    would): while plain steps win, it is the cheapest tree whose verdict can show that trees win again."""
    plain = tokens_per_s(inputs, plain_step(inputs))
    for depth in range(1, max(0, inputs.max_depth) + 1):
        size = TreeSize(tree_nodes(inputs, depth), depth)
        if size.nodes > inputs.max_nodes:
            break
        if (depth + 1) / max(step_time(inputs, size), 1e-9) > plain:
            return size
    return PLAIN
