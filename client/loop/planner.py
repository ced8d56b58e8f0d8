"""What the loop measures to size its trees and to decide whether drafting ahead pays.

``LoopEstimates`` keeps, across one client's generations, the figures the planner
(``tree_size.py``) weighs: the link's round trip (each Draft's round trip less the
server's own time), the server's verification time by tree size (the curve Info
reports, scaled by what Verified timings show), the drafter's time per level of
depth, its acceptance by depth, its nodes per level and the share of guesses
that hit. Each is a running average that forgets, so a link that gets worse, or a
topic where the drafter does badly, moves the plan within a few steps; and a new
generation keeps the acceptance measured before as its starting point, at the
weight of a couple of verdicts, so one client serving code and then chat leaves
trees within a few steps of the chat (it took ~24 trees when the counts only
faded by 5 % a verdict).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
from dataclasses import dataclass
from typing import Sequence

from edgespec.shared.tree import DraftTree

from edgespec.shared.wire import MAX_DECODE_AHEAD

from .tree_size import (PLAIN, PlanInputs, TreeSize, best_tree, expected_tokens, path_floors, plain_step, plan_tree,
                        probe_tree, step_time, switch_pays, tree_nodes, verify_time)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopConfig:
    """How the client's loop runs: the client's choice, the same for each of its generations."""

    pipeline: bool = True  # draft the next tree while a verification is out (drafters that can guess only)
    tree: str = "auto"  # "auto": each step's tree sized to the most tokens per second (planner.py); "fixed":
    # the drafter's own shape every step, as the serial loop always did
    max_guesses: int = 2  # most verdicts drafted ahead for per verification, the likeliest first, while it is out
    stop_missed: bool = True  # a tree drafted ahead stops at its next pass once the verdict has come and rules
    # it out (verdict.may_still_hit), so a wrong guess costs no drafting past its verdict; then drafting the first
    # guess in full never loses to drafting it shallower or not at all, and the planner charges a miss the
    # drafting after the verdict alone (planner.step_time)
    depth_by_path: bool = False  # a planned tree goes as deep as its own best path pays for (planner.path_floors:
    # the drafter's min_prob, set from the loop's costs and its calibration), not to the depth the average
    # acceptance pays for. Off: on Spec-Bench --limit 1 at 5g (bf16, 2-core EPYC) its trees committed more a
    # verdict (mean accepted tokens 4.09 against 3.76) but its longer guessed paths hit less (0.47 against
    # 0.57), 0.99x the capped loop's tokens/s (loop mode auto-by-path; netem/README.md "Trees stopped by their own paths")
    min_guess_probability: float = 0.0  # a guess less likely than this is not drafted ahead for (drafting ahead
    # costs nothing while the client would idle, and the planner weighs it by the hit rate measured otherwise)
    max_depth: int = 16  # deepest tree the planner weighs (the drafter's own shape caps it too)
    explore_every: int = 8  # at least this many plain steps in a row before one drafts a small tree, a probe
    # (TreePlanner._plain_or_probe), so acceptance keeps being measured while trees lose; the first plain step
    # of each generation probes regardless
    explore_share: float = 0.05  # most the probes may lose against plain steps, as a share of the plain steps'
    # time: where a tree costs 4x a plain step (a one-core CPU server) probes come tens of plain steps apart,
    # where trees come close to plain steps every explore_every
    decode_ahead: int = 8  # most tokens a plain step asks the target to decode on its own (Draft.decode_ahead): a
    # plain step that pays a round trip per token loses to the plain API's stream (4g: 0.78 s a token against 0.50)
    ahead_overhead: float = PlanInputs.ahead_overhead  # a plain step asks for the fewest tokens (up to decode_ahead)
    # that keep the round trip at most this share of its time (0.1): on a GPU server (decode steps of
    # milliseconds) that is decode_ahead, on a one-core CPU server (0.3-0.5 s a step) one to a few
    queue_plain: bool = True  # in the pipelined loop, a plain step goes out behind the one before it, before its
    # answer (Draft.queued), so the target decodes on while answers cross the link
    overlap_open: bool = True  # in the pipelined loop, Open goes out without a tree while the drafter reads the
    # prompt and drafts, when the server's prefill and the drafter's would both outlast a round trip and a
    # verification (LoopEstimates.open_overlap_pays): a one-core CPU server's prefill then no longer waits for
    # the client's (a 160-token prompt: ~2.5 s and ~1.5 s on this box, in a row before)
    settle: bool = True  # a switch between plain steps and trees must pay for what it costs (planner.switch_cost:
    # the first plain step's round trip, or the first tree's drafting ahead) over explore_every steps, so
    # estimates that swing around the break-even do not swing the loop (on prose at satellite delays the loop
    # switched kinds every few steps, at 0.84x the plain API where either kind alone came level with it)
    copies: bool = True  # where the planner makes a step plain, a drafter's copy (Drafter.copy_tree: the lookup
    # of an ``+ngram`` drafter) goes in its place when its measured acceptance pays for it (TreePlanner.copy_pays),
    # and no plain step is queued while the text is copying (DraftPipeline.copy_coming)
    warmup_trees: int = 3  # trees of the drafter's own shape verified before the planner sizes any: a plain
    # step measures no acceptance, so a planner that starts from its prior alone can settle on plain steps
    # with a drafter whose trees would win (seen on a one-core server: the 0.5B drafter at 1.9 tokens a step
    # where its fixed trees committed 12.8)

    def __post_init__(self) -> None:
        if self.tree not in ("auto", "fixed"):
            raise ValueError(f"tree must be 'auto' or 'fixed', got {self.tree!r}")
        if (self.max_guesses < 0 or self.max_depth < 1 or self.explore_every < 1 or self.warmup_trees < 0
                or self.explore_share < 0):
            raise ValueError(f"need max_guesses >= 0, max_depth >= 1, explore_every >= 1, warmup_trees >= 0 and "
                             f"explore_share >= 0, got {self}")
        if not 1 <= self.decode_ahead <= MAX_DECODE_AHEAD or not 0 < self.ahead_overhead < 1:
            raise ValueError(f"decode_ahead must be between 1 and {MAX_DECODE_AHEAD} (got {self.decode_ahead}) and "
                             f"ahead_overhead between 0 and 1 exclusive (got {self.ahead_overhead})")


def _ema(old: float | None, new: float, weight: float) -> float:
    return new if old is None else old + weight * (new - old)


def _interpolate(curve: dict[int, float], nodes: int) -> float:
    sizes = sorted(curve)
    return verify_time(nodes, sizes, [curve[n] for n in sizes])


class LoopEstimates:
    """Running figures of one client (its generations run one at a time; the lock guards the odd reader)."""

    WEIGHT = 0.2  # share of a new observation in a running average
    PRIOR = 1.0  # pseudo-observations behind each depth's acceptance before it is measured
    PRIOR_ACCEPTANCE = 0.6  # what an unmeasured first depth is taken to accept
    PRIOR_HIT_RATE = 0.3  # what the guesses are taken to hit before any was checked
    FORGET = 0.1  # share of the acceptance counts each verdict fades: about the last 10 verdicts count, so
    # a drop in acceptance moves the plan within a few trees (at 0.05 a chat answer after code took ~20)
    CALIBRATION_RANGE = (0.25, 4.0)  # a few verdicts of a text the drafter gets all wrong (or right) must not
    # stop every tree at its root (or never)
    COPY_PRIOR = 0.8  # per-token acceptance a copy (a lookup's tree sent in place of a plain step) is taken to
    # have before one was verified: a 3-4 token match continues as before most of the time on code
    COPY_PRIOR_WEIGHT = 2.0  # tokens' worth of evidence behind COPY_PRIOR: two copies refused at their first
    # token take it to ~0.4
    CARRY = 2.0  # verdicts' worth of acceptance counts a new generation starts with (new_generation)

    def __init__(self, curve_nodes: Sequence[int] = (), curve_s: Sequence[float] = ()):
        self._lock = threading.Lock()
        # The server's curve as Info reported it (measured on a short context at start), scaled by what its
        # answers show (a longer context, a busier server); the sizes actually verified replace it with their
        # own running averages. Without a curve from Info, the sizes seen are the curve.
        self.reported = dict(zip((int(n) for n in curve_nodes), (float(s) for s in curve_s)))
        self.seen: dict[int, float] = {}  # tree size -> running average of the server's time on it
        self._scale = 1.0
        self.round_trip_s: float | None = None
        self.pass_s: float | None = None
        self.nodes_per_depth: float | None = None
        self.reached: list[float] = []  # [i]: verdicts whose tree reached depth i + 1 with depth i accepted
        self.accepted: list[float] = []  # [i]: ... of which depth i + 1 was accepted
        self.hit_rate = self.PRIOR_HIT_RATE
        self.empty_rate = 0.0  # share of the trees asked for that the drafter left empty (an n-gram without a match)
        self.trees_verified = 0  # verdicts on non-empty trees
        self.server_decodes_ahead = False  # a plain step came back with Verified.decoded: the server knows it
        self.last_whole = False  # the last tree verified was accepted down to its deepest node
        self.open_s_per_token: float | None = None  # the drafter's time to read a prompt and draft from it, per
        # prompt token (its prefill dominates; an n-gram drafter's is ~0)
        self.open_nodes = 0  # the size of the last tree drafted from a prompt
        self.largest_tree = 0  # the most nodes a tree drafted had: the drafter's own cap, where it has one
        self.node_price_s = 0.0  # what a node costs the other sessions of the server's forwards (the server's load
        # price: row cost x (sharing - 1)); 0 alone, so a lone session plans as before
        self._copy_tried = 0.0  # running sums over copies' verdicts: the tokens tried (accepted, and the first one
        self._copy_accepted = 0.0  # rejected, where the path went on) and the tokens accepted
        self._promised = 0.0  # running sums over verdicts: the tokens the drafter's probabilities promised ...
        self._delivered = 0.0  # ... and the tokens the target accepted (calibration)

    # ------------------------------------------------------------ observing
    def observe_draft(self, tree: DraftTree, seconds: float) -> None:
        """The drafter took `seconds` for `tree` (a proposal, ahead or not)."""
        if not len(tree):
            return
        depth = max(tree.depths())
        with self._lock:
            self.largest_tree = max(self.largest_tree, len(tree))
            self.pass_s = _ema(self.pass_s, seconds / (depth + 1), self.WEIGHT)
            self.nodes_per_depth = _ema(self.nodes_per_depth, len(tree) / depth, self.WEIGHT)

    def observe_verdict(self, tree: DraftTree, accepted: int, round_trip_s: float | None, server_s: float,
                        decoded: int = 1, scores: Sequence[float] | None = None, copy: bool = False) -> None:
        """A Draft of `tree` came back with `accepted` nodes after `round_trip_s` (None: not timed, a queued
        step), `server_s` of it the server's; a plain step that decoded ahead made `decoded` tokens (the curve
        keeps one decode step's time). `scores`: the drafter's log-probability per node, where it gave them.
        `copy`: the tree was a lookup's copy sent in place of a plain step; its acceptance is the copies' own
        (``copy_acceptance``), not the drafter's, whose trees the planner sizes from theirs."""
        with self._lock:
            if scores is not None and len(scores) == len(tree) and len(tree):
                # the nodes' path probabilities add up to the tokens the drafter expected accepted
                keep = 1.0 - self.FORGET
                self._promised = self._promised * keep + sum(math.exp(min(0.0, s)) for s in scores)
                self._delivered = self._delivered * keep + accepted
            if round_trip_s is not None:
                self.round_trip_s = _ema(self.round_trip_s, max(0.0, round_trip_s - server_s), self.WEIGHT)
            n = len(tree)
            if not n:  # the curve's size 0 is one decode step
                server_s /= max(1, decoded)
            if server_s > 0:
                self.seen[n] = _ema(self.seen.get(n), server_s, self.WEIGHT)
                if self.reported:
                    base = _interpolate(self.reported, n)
                    if base > 0:
                        self._scale = _ema(self._scale, server_s / base, self.WEIGHT)
            if not n:
                return
            if copy:
                keep = 1.0 - self.FORGET
                self._copy_tried = self._copy_tried * keep + min(max(tree.depths()), accepted + 1)
                self._copy_accepted = self._copy_accepted * keep + accepted
                return
            self.trees_verified += 1
            self.last_whole = accepted >= max(tree.depths())
            reached = min(max(tree.depths()), accepted + 1)  # depths 1..reached were tried
            while len(self.reached) < reached:
                self.reached.append(0.0)
                self.accepted.append(0.0)
            # Every verdict fades every depth's counts, the ones it did not reach too: a depth the text being
            # written no longer reaches falls back to its prior (the depth before it) instead of keeping the
            # rate an older text gave it (code's deep acceptance, kept through a chat answer, kept trees going).
            for i in range(len(self.reached)):
                self.reached[i] = self.reached[i] * (1 - self.FORGET) + (i < reached)
                self.accepted[i] = self.accepted[i] * (1 - self.FORGET) + (accepted > i)

    def observe_load(self, row_cost_s: float, sharing: float) -> None:
        """The server's load price with a verdict: each node a tree holds adds ``row_cost_s`` to forwards that
        ``sharing`` items wait on; the others' part is what this client's trees cost them."""
        if sharing <= 0:  # a server that does not say
            return
        with self._lock:
            self.node_price_s = _ema(self.node_price_s, max(0.0, row_cost_s) * max(0.0, sharing - 1.0), self.WEIGHT)

    def new_generation(self) -> None:
        """A new prompt may be another kind of text (a chat answer after code, or the reverse): the acceptance
        measured so far stays the starting point (a client serving similar prompts need not measure it again),
        but at the weight of CARRY verdicts at most, so the new text's first few verdicts outweigh it."""
        with self._lock:
            if self.reached and self.reached[0] > self.CARRY:
                keep = self.CARRY / self.reached[0]
                self.reached = [r * keep for r in self.reached]
                self.accepted = [a * keep for a in self.accepted]

    def observe_open_draft(self, prompt_len: int, seconds: float, nodes: int) -> None:
        """The drafter took `seconds` to draft its first tree, of `nodes` nodes, from a prompt of `prompt_len`
        tokens."""
        with self._lock:
            self.open_s_per_token = _ema(self.open_s_per_token, seconds / max(1, prompt_len), self.WEIGHT)
            self.open_nodes = nodes

    def observe_guess(self, hit: bool) -> None:
        with self._lock:
            self.hit_rate = _ema(self.hit_rate, 1.0 if hit else 0.0, self.WEIGHT)

    def observe_proposal(self, empty: bool) -> None:
        """The drafter was asked for a tree and left it empty (or not)."""
        with self._lock:
            self.empty_rate = _ema(self.empty_rate, 1.0 if empty else 0.0, self.WEIGHT)

    def observe_no_guess(self) -> None:
        """A flight went without drafting ahead because the hit rate looked too low to pay. Guesses not made
        are not checked, so a low estimate would stay low for good: it drifts back toward the prior instead,
        and drafting ahead is tried again after a few such flights."""
        with self._lock:
            self.hit_rate = _ema(self.hit_rate, self.PRIOR_HIT_RATE, self.WEIGHT / 2)

    # ------------------------------------------------------------- planning
    def curve(self) -> dict[int, float]:
        """Verification time by tree size: the sizes seen, and the reported ones (scaled) between them."""
        out = {n: t * self._scale for n, t in self.reported.items()}
        out.update(self.seen)
        return out

    def calibration(self) -> float:
        """Tokens the target accepts for each one the drafter's own probabilities promise (1 until measured; kept
        within CALIBRATION_RANGE): a drafter surer than it is right stops its trees too late, one less sure too
        early (planner.path_floors)."""
        with self._lock:
            if self._promised <= 0:
                return 1.0
            low, high = self.CALIBRATION_RANGE
            return min(high, max(low, self._delivered / self._promised))

    def copy_acceptance(self) -> float:
        """The chance that a copy's next token is accepted once the ones before it were (a lookup that has
        matched tends to go on matching, so one rate for every depth)."""
        with self._lock:
            return ((self._copy_accepted + self.COPY_PRIOR_WEIGHT * self.COPY_PRIOR)
                    / (self._copy_tried + self.COPY_PRIOR_WEIGHT))

    def acceptance(self) -> tuple[float, ...]:
        """Per-depth acceptance, each depth's prior the depth before it (the first: PRIOR_ACCEPTANCE)."""
        out, prior = [], self.PRIOR_ACCEPTANCE
        for reached, accepted in zip(self.reached, self.accepted):
            prior = (accepted + self.PRIOR * prior) / (reached + self.PRIOR)
            out.append(prior)
        return tuple(out) or (prior,)

    def verify_flight_s(self, nodes: int) -> float:
        """Expected round trip of a Draft of `nodes` nodes (link and server)."""
        with self._lock:
            curve = self.curve()
            return (self.round_trip_s or 0.0) + (_interpolate(curve, nodes) if curve else 0.0)

    def open_overlap_pays(self, prompt_len: int) -> bool:
        """Is Open sent alone, the drafter drafting from the prompt meanwhile, faster than Open with the tree?
        Alone it costs a second round trip and a verification of the tree (R + V), and takes the shorter of the
        server's prefill (S) and the client's drafting from the prompt (C, less the round trip it overlaps)
        off the time in a row: it pays when min(S, C - R) > V. Unknown until a first generation measured C."""
        with self._lock:
            curve = self.curve()
            if self.open_s_per_token is None or not curve:
                return False
            rtt = self.round_trip_s or 0.0
            server = _interpolate(curve, prompt_len)  # a prefill of n tokens ~ a tree of n nodes
            return min(server, self.open_s_per_token * prompt_len - rtt) > _interpolate(curve, self.open_nodes)

    def draft_s(self, depth: int) -> float:
        return (self.pass_s or 0.0) * (depth + 1)

    def inputs(self, max_nodes: int, max_depth: int, pipelined: bool, max_ahead: int = 1,
               ahead_overhead: float = PlanInputs.ahead_overhead, queue_plain: bool = False,
               stop_missed: bool = False) -> PlanInputs | None:
        """What the planner needs, or None while something is not measured yet (no curve, no round trip,
        no drafting time)."""
        with self._lock:
            curve = self.curve()
            if not curve or self.round_trip_s is None or self.pass_s is None:
                return None
            sizes = sorted(curve)
            # Trees are planned at the server's price too: a node costs this client its own time and the other
            # sessions' (node_price_s each), so trees shrink as the server fills, and not at all alone.
            return PlanInputs(
                round_trip_s=self.round_trip_s, verify_nodes=tuple(sizes),
                verify_s=tuple(curve[n] + n * self.node_price_s for n in sizes), draft_pass_s=self.pass_s,
                acceptance=self.acceptance(), nodes_per_depth=self.nodes_per_depth or 1.0,
                max_nodes=max_nodes, max_depth=max_depth, hit_rate=self.hit_rate if pipelined else 0.0,
                max_ahead=max(1, max_ahead), ahead_overhead=ahead_overhead, queue_plain=queue_plain,
                stop_missed=stop_missed)


class TreePlanner:
    """Each step's tree size, from the estimates (``tree="auto"``) or the drafter's own shape (``"fixed"``)."""

    def __init__(self, config: LoopConfig, estimates: LoopEstimates, max_nodes: int, can_pipeline: bool,
                 by_path: bool = False):
        self.config, self.estimates, self.max_nodes = config, estimates, max_nodes
        self.pipelined = config.pipeline and can_pipeline
        self.by_path = config.depth_by_path and by_path  # the drafter stops its trees by path_floors
        # One planner per generation, and a new prompt may be text the drafter does well on where the last one's
        # was not: its first plain step probes, unless a tree went first.
        self._plain_in_a_row, self._plain_s = config.explore_every, math.inf
        self.probing = False  # the last step asked for was a probe (not a tree the estimates chose)
        self.last_plain: bool | None = None  # the kind of the last step asked for (None: none yet)

    def size(self, remaining: int, explore: bool = True) -> TreeSize:
        """The tree for a step that may commit at most `remaining` tokens (the bonus token included);
        explore=False for a tree drafted ahead (it does not count toward the plain steps in a row)."""
        depth = max(0, remaining - 1)
        full = TreeSize(self.max_nodes, depth) if depth else PLAIN
        if self.config.tree == "fixed" or full.plain:
            return full
        inputs = self.estimates.inputs(self.max_nodes, min(depth, self.config.max_depth), self.pipelined,
                                       min(self.config.decode_ahead, remaining), self.config.ahead_overhead,
                                       self.config.pipeline and self.config.queue_plain, self.config.stop_missed)
        if inputs is None or self.estimates.trees_verified < self.config.warmup_trees:
            size = full  # not measured enough yet: the drafter's own shape, which measures it
        else:
            size = self._settled(inputs, plan_tree(inputs), in_trees=not explore or self.last_plain is False)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("plan %s: round trip %.3f s, pass %.3f s, curve %s, acceptance %s, nodes/depth %.1f, "
                          "hit rate %.2f", size, inputs.round_trip_s, inputs.draft_pass_s,
                          {n: round(s, 3) for n, s in zip(inputs.verify_nodes, inputs.verify_s)},
                          [round(a, 2) for a in inputs.acceptance], inputs.nodes_per_depth, inputs.hit_rate)
            if self.by_path and not size.plain:
                # a deeper tree adds no nodes past the drafter's own cap (the biggest tree seen): no verification
                # time for a level to pay for there
                capped = dataclasses.replace(inputs, max_nodes=min(inputs.max_nodes,
                                                                   self.estimates.largest_tree or inputs.max_nodes))
                deepest = inputs.max_depth
                size = TreeSize(min(self.max_nodes, tree_nodes(inputs, deepest)), deepest,
                                floors=path_floors(capped, size, self.estimates.calibration()))
        if not explore:
            return size
        if size.plain:
            size = self._plain_or_probe(inputs)
        else:
            self.probing = False
        if not size.plain:
            self._plain_in_a_row, self._plain_s = 0, 0.0
        self.last_plain = size.plain
        return size

    def copy_pays(self, tree: DraftTree, remaining: int) -> bool:
        """Does sending `tree`, a copy that cost no drafting (``Drafter.copy_tree``), commit tokens faster than
        the plain step it replaces? Its expected tokens (the bonus and each depth at the copies' measured
        acceptance) over a round trip and its verification, against the plain step's tokens per second; where
        plain steps are queued, a copy also stops the stream, a round trip more. Unknown costs: no."""
        depth = max(tree.depths()) if len(tree) else 0
        if not depth:
            return False
        inputs = self.estimates.inputs(self.max_nodes, depth, self.pipelined, min(self.config.decode_ahead, remaining),
                                       self.config.ahead_overhead, self.config.pipeline and self.config.queue_plain)
        if inputs is None:
            return False
        plain = plain_step(inputs)
        copy_s = inputs.round_trip_s * (2 if inputs.queue_plain else 1) + verify_time(
            len(tree), inputs.verify_nodes, inputs.verify_s)
        tokens = expected_tokens((self.estimates.copy_acceptance(),), depth)
        return tokens * step_time(inputs, plain) > plain.ahead * copy_s

    def _settled(self, inputs: PlanInputs, planned: TreeSize, in_trees: bool) -> TreeSize:
        """The planned step, unless it switches kinds (plain steps and trees) and the switch does not pay for
        its cost over explore_every steps (``planner.switch_pays``): then the best of the kind the loop is on.
        `in_trees`: the loop's last step was a tree (a tree drafted ahead is asked for while one is out)."""
        if not self.config.settle or (self.last_plain is None and not in_trees) or planned.plain != in_trees:
            return planned
        current = best_tree(inputs) if in_trees else plain_step(inputs)
        if current is None or switch_pays(inputs, current, planned, self.config.explore_every):
            return planned
        return current

    def _plain_or_probe(self, inputs: PlanInputs) -> TreeSize:
        """A step while plain steps win: plain, or now and then a probe, the shallowest tree that would win were
        the drafter right on every node (``probe_tree``; cheaper than the drafter's own shape, and on a CPU
        server a tree costs several plain steps). A probe comes after explore_every plain steps at the least, and
        once what it is expected to lose against them (its time less theirs for its expected tokens) is at most
        explore_share of their time since the last one. A probe the target took whole is followed by another at
        once: one verdict does not outweigh what was measured before, a run of them does, and takes the loop
        back to trees within a few steps."""
        followed, self.probing = self.probing and self.estimates.last_whole, False
        plain = plain_step(inputs)
        probe = probe_tree(inputs)  # at the planner's costs: trees that win are drafted ahead
        if probe.plain:
            return plain  # no tree could win here, whatever the drafter's acceptance
        # counted in steps, not tokens: a plain step that decodes 8 ahead is no reason to probe 8 times as often
        # (at 600 ms round trips, probes every plain step or two cost the 0.5B client 12 % on prose)
        self._plain_in_a_row += 1
        plain_s = step_time(inputs, plain)
        self._plain_s += plain_s
        serial = dataclasses.replace(inputs, hit_rate=0.0)  # between plain steps nothing is drafted ahead
        loss = step_time(serial, probe) - expected_tokens(inputs.acceptance, probe.depth) * plain_s / plain.ahead
        if inputs.queue_plain:  # the plain step after a probe cannot be queued: the server idles a round trip
            loss += inputs.round_trip_s
        if followed or (self._plain_in_a_row > self.config.explore_every
                        and loss <= self.config.explore_share * self._plain_s):
            self.probing = True
            return probe
        return plain

    def worth_drafting_ahead(self, flight_nodes: int, next_depth: int, elapsed_s: float, first: bool) -> bool:
        """Is one more tree drafted ahead likely to pay? Always where a verdict that rules a tree out stops its
        drafting (stop_missed): a tree the verdict matches goes out sooner than one drafted after it would, and
        one it rules out costs at most the pass under way. Otherwise the first pays while the drafter would
        finish before the verdict; past that, drafting delays a verdict that comes first, so it must hit often
        enough to pay for the delay (hit rate > 1 - flight / draft); further guesses only use time that is
        idle anyway."""
        if not self.pipelined:
            return False
        est = self.estimates
        left = est.verify_flight_s(flight_nodes) - elapsed_s
        draft = est.draft_s(next_depth)
        if draft <= left or est.pass_s is None or self.config.stop_missed:
            return True
        if not first:
            return False
        return est.hit_rate * draft > draft - max(0.0, left)

    def depth_within_flight(self, flight_nodes: int, elapsed_s: float) -> int:
        """The deepest tree drafted ahead (its bonus level on top) that is likely done before the verdict comes:
        drafting it delays nothing, so it is worth a guess whatever the hit rate, and it measures the hit rate
        (a rate only ever guessed at would keep the loop serial where guesses hit: code, ~95 %)."""
        est = self.estimates
        if not self.pipelined or est.pass_s is None or est.pass_s <= 0:
            return 0
        left = est.verify_flight_s(flight_nodes) - elapsed_s
        return max(0, int(left / est.pass_s) - 2)  # a tree of depth D drafted ahead takes D + 2 passes
