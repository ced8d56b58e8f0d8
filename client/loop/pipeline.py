"""Drafting while the Draft is in flight: the online step's machinery
(client/README.md, "The pipeline and the planner").

A Draft goes out at once and a worker thread waits for its answer (the gRPC
stream reads answers on its own thread and torch releases the GIL, so the
client's drafter keeps working); while it is out, the client guesses the verdict
from the drafter's scores (``verdict.py``) and drafts the next tree from the
likeliest outcomes, as long as the verdict has not come and another tree is
likely to pay (``TreePlanner``). A verdict a guess matched sends the part of that
tree below its bonus token at once; any other verdict drops the trees drafted
ahead. The caller's thread waits for the answer itself when nothing would be
drafted meanwhile (the pipeline is off, the drafter cannot guess, or the tree
is empty). A plain step needs no verdict to follow: the next plain step goes
behind it before its answer comes (``queue_plain``), so on a long link the
target decodes on while the answers travel, as the plain API's stream does.

Which trees are sent never changes what the target accepts, so the output is
the serial loop's; only the time differs, and ``GenerationMetrics`` counts it:
guesses and hits, drafting done ahead, time saved, time idle. Each phase is timed
by the pipeline's ``StepLog`` (``step_record.py``), which writes the metrics and
the planner's estimates from one record a step.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from edgespec.shared.metrics import GenerationMetrics
from edgespec.shared.tree import DraftTree

from edgespec.client.drafters.base import Drafter, DraftRequest
from edgespec.client.link.verifier import Verdict, Verifier

from .planner import LoopConfig, LoopEstimates, TreePlanner
from .step_record import StepLog, StepRecord
from .tree_size import TreeSize
from .verdict import Outcome, likely_outcomes, may_still_hit, tree_after

log = logging.getLogger(__name__)

Scored = tuple[DraftTree, Sequence[float] | None]  # a tree and the drafter's log-probability per node (or None)


@dataclass
class Flight:
    """A Draft out for verification."""

    committed: tuple[int, ...]  # the committed ids the tree hangs from
    tree: DraftTree
    scores: Sequence[float] | None  # the drafter's log-probability per node (None: it cannot guess)
    record: StepRecord  # the step as it happens (step_record.py): its step, ahead, queued, sent and answered
    future: Future = field(default_factory=Future)  # -> Verdict
    wait: Callable[[], Verdict] | None = None  # waits for the answer on the caller's thread, in ``land`` (None: a
    # worker waits for it, or it came)

    @property
    def queued(self) -> bool:
        """A plain step sent before the answer to the one before it (Draft.queued)."""
        return self.record.queued


@dataclass(frozen=True)
class Prepared:
    """A tree drafted ahead, while a Draft was out, for a guessed verdict."""

    outcome: Outcome  # the accepted path guessed
    tree: DraftTree  # hangs from the flight's text plus that path: its depth-1 nodes are the bonus tokens covered
    scores: Sequence[float]
    size: TreeSize  # what the tree after the bonus token may hold
    draft_s: float  # drafting it took


def sent_after(p: Prepared, verdict: Verdict, flight_tree: DraftTree) -> Scored | None:
    """What the tree drafted ahead `p` sends for this verdict on `flight_tree`: the part below the tokens the
    verdict accepted past the guessed path and its bonus token, or None when the guess missed (the verdict did
    not accept the guessed path, or the tree lacks that path, or holds nothing below it)."""
    accepted, n = tuple(verdict.accepted), len(p.outcome.path)
    if accepted[:n] != p.outcome.path:
        return None
    past = [flight_tree.tokens[i] for i in accepted[n:]]
    after = tree_after(p.tree, p.scores, [*past, verdict.bonus_token], p.size.nodes)
    return after if after is not None and len(after[0]) else None


@dataclass(eq=False)
class StopWhenMissed:
    """DraftRequest.stop for a tree drafted ahead for `outcome` of `flight_tree`: once the verdict is in, stop
    when no candidate can match it (``verdict.may_still_hit``), or when a tree drafted before this one for the same
    flight matches it already; the next tree is then drafted, or sent, without waiting for this one."""

    outcome: Outcome
    flight_tree: DraftTree
    verdict: Callable[[], Verdict | None]  # the answer, or None while it has not come
    earlier: tuple[Prepared, ...]
    fired: bool = False

    def __call__(self, candidates: DraftTree) -> bool:
        try:
            v = self.verdict()
        except Exception:  # noqa: BLE001 - the Draft failed (the link): nothing drafted ahead goes out
            v, self.fired = None, True
        if v is not None:
            self.fired = any(sent_after(p, v, self.flight_tree) is not None for p in self.earlier) or not (
                may_still_hit(candidates, self.outcome.path, self.flight_tree, v.accepted, v.bonus_token))
        return self.fired


class DraftPipeline:
    """One generation's Drafts: drafted (sized by the planner), sent, drafted ahead, landed, matched."""

    def __init__(self, verifier: Verifier, drafter: Drafter, loop: LoopConfig, estimates: LoopEstimates,
                 max_tree_nodes: int, metrics: GenerationMetrics, grammar=None, prompt_len: int = 0):
        self.verifier, self.drafter, self.loop, self.estimates = verifier, drafter, loop, estimates
        self.max_tree_nodes, self.metrics = max_tree_nodes, metrics
        self.steps = StepLog(metrics, estimates)  # times each phase and writes both the metrics and the estimates
        # Under a grammar (shared.grammar.GrammarConstraint) trees are drafted inside it and pruned to it;
        # pruning re-indexes nodes, so the drafter's scores no longer fit the tree and nothing is drafted ahead.
        self.grammar, self.prompt_len = grammar, prompt_len
        can_guess = type(drafter).tree_scores is not Drafter.tree_scores
        # Copies in place of plain steps: only drafters that have any (Drafter.copy_tree), never under a grammar (a
        # copy is not drafted inside it) nor with the drafter's fixed shape
        self._copies = (loop.copies and grammar is None and loop.tree != "fixed"
                        and type(drafter).copy_tree is not Drafter.copy_tree)
        estimates.new_generation()  # the previous prompts' acceptance is a starting point, not the answer
        self.planner = TreePlanner(loop, estimates, max_tree_nodes, can_guess, by_path=drafter.stops_by_path)
        self._pool: ThreadPoolExecutor | None = None  # the worker a Draft waits for its answer on

    def draft_now(self, committed: Sequence[int], remaining: int, size: TreeSize | None = None
                  ) -> tuple[DraftTree, Sequence[float] | None, int]:
        """A tree from the committed text for a step that may commit `remaining` tokens, of the size the
        planner picks (or `size`, picked already), and how many tokens the target is to decode ahead (none: an
        empty tree, a plain step of that many tokens)."""
        size = self.planner.size(remaining) if size is None else size
        if size.plain:
            copy = self._copy(committed, remaining, record=True)
            if copy is not None:
                return copy, None, 1
            return DraftTree((), ()), None, size.ahead
        tree = self.steps.draft(lambda: self._propose(committed, size, remaining - 1))
        return tree, self.drafter.tree_scores() if self.grammar is None else None, 1

    def copy_coming(self, committed: Sequence[int], remaining: int) -> bool:
        """Would a copy replace the next plain step? Then no plain step is queued behind this one: the text
        after it is likely still copying, and the copy goes out once its answer is in (a round trip the server
        idles, against a decode step per copied token)."""
        return self._copy(committed, remaining, record=False) is not None

    def _copy(self, committed: Sequence[int], remaining: int, record: bool) -> DraftTree | None:
        """The drafter's copy (``Drafter.copy_tree``) for a step the planner made plain, where sending it pays
        (``TreePlanner.copy_pays``); `record`: it is to be sent next (``StepLog.copy``)."""
        if not self._copies or remaining < 2:
            return None
        began = self.steps.clock()
        tree = self.drafter.copy_tree(tuple(committed), self.max_tree_nodes, remaining - 1)
        if not len(tree) or not self.planner.copy_pays(tree, remaining):
            return None
        if record:
            self.steps.copy(began)
        return tree

    def _propose(self, committed: Sequence[int], size: TreeSize, free_depth: int = 0) -> DraftTree:
        if self.grammar is None:
            return self.drafter.propose(DraftRequest(tuple(committed), size.nodes, size.depth,
                                                     path_floors=size.floors, free_depth=free_depth))
        output = tuple(committed[self.prompt_len:])
        tree = self.drafter.propose(DraftRequest(tuple(committed), size.nodes, size.depth,
                                                 self.grammar.after(output), path_floors=size.floors))
        return self.grammar.prune(output, tree)

    def send(self, step: int, committed: Sequence[int], tree: DraftTree, scores: Sequence[float] | None,
             ahead: int = 1) -> Flight:
        """Send a Draft; a worker waits for its answer when there will be drafting ahead to do meanwhile, else
        ``land`` does."""
        flight = Flight(tuple(committed), tree, scores, self.steps.send(step, len(tree), ahead))
        if log.isEnabledFor(logging.DEBUG):  # the depth walks the tree: not on every step at INFO
            log.debug("step %d sent: %d nodes, depth %d, ahead %d", step, len(tree),
                      max(tree.depths()) if len(tree) else 0, ahead)
        self._post(flight, len(committed), worker=self.planner.pipelined and scores is not None and len(tree) > 0)
        return flight

    def queue_plain(self, step: int, before: Flight, ahead: int) -> Flight:
        """Send a plain step of `ahead` tokens behind the plain step `before`, whose answer has not come: it
        hangs from where that one leaves the text, so the target decodes on while that answer and this Draft
        cross the link (a stream's pace, where a step at a time idles the server a round trip each)."""
        flight = Flight(before.committed, DraftTree((), ()), None, self.steps.send(step, 0, ahead, queued=True))
        log.debug("step %d queued: ahead %d", step, ahead)
        self._post(flight, len(before.committed) + before.record.ahead, worker=False)
        return flight

    def queue_anyway(self, flight: Flight) -> bool:
        """The planner wants a tree next, but this step's tree came back empty and most do: the drafter will
        likely have none next either (an n-gram client on prose), so a one-token plain step goes behind this
        one rather than the server idling a round trip for an empty tree. A match it delays is not lost: the
        tree comes a token later."""
        return flight.record.emptied and self.estimates.empty_rate >= 0.5

    def can_queue(self, flight: Flight) -> bool:
        """May a plain step go behind this one before its answer? Only in the pipelined loop, and, past one token,
        once this server has shown it decodes ahead: a server that ignores Draft.decode_ahead answers one token,
        and the Draft queued behind would hang past its text."""
        return (self.loop.pipeline and self.loop.queue_plain and not len(flight.tree)
                and (flight.record.ahead == 1 or self.estimates.server_decodes_ahead))

    def _post(self, flight: Flight, committed_len: int, worker: bool) -> None:
        r = flight.record
        try:
            wait = self.verifier.send_draft(r.step, committed_len, flight.tree, r.ahead, r.queued)
        except Exception as err:  # noqa: BLE001 - raised where the answer is taken, as the answer's own errors
            flight.future.set_exception(err)
            return
        if worker:
            flight.future = self.submit(lambda: self.steps.answer(flight.record, wait))
        else:
            flight.wait = wait

    def _answer(self, flight: Flight) -> Verdict:
        wait, flight.wait = flight.wait, None
        if wait is not None:
            try:
                flight.future.set_result(self.steps.answer(flight.record, wait))
            except Exception as err:  # noqa: BLE001 - kept for whoever takes the answer
                flight.future.set_exception(err)
        return flight.future.result()

    def land(self, flight: Flight) -> Verdict:
        """Wait for the flight's answer (the client's idle time; its figures go to the metrics and the estimates:
        ``StepLog.land``). Raises what the verification raised (LinkDownError: the link)."""
        r = flight.record
        verdict = self.steps.land(r, lambda: self._answer(flight), flight.tree, flight.scores)
        log.debug("step %d landed: accepted %d, decoded %d, round trip %.3f s (server %.3f s), waited %.3f s",
                  r.step, r.accepted, r.decoded, r.arrived - r.sent, r.server_s, r.waited_s)
        return verdict

    def open_alone(self, prompt_len: int, wanted: int) -> TreeSize | None:
        """Open without a tree, the first tree drafted from the prompt meanwhile (``draft_from_prompt``)? The
        size that tree may hold after the first token when so, None when Open should carry the tree."""
        if not (self.planner.pipelined and self.loop.overlap_open) or self.grammar is not None or wanted < 3:
            return None
        if self.planner.size(wanted - 1, explore=False).plain or not self.estimates.open_overlap_pays(prompt_len):
            return None
        # the drafter's own shape, as a tree sent with Open has: its drafting hides behind the server's prefill
        # (the planner's pipelined size, ~half as deep on code, lost a second of it again: 0.3 s saved, not 1.5)
        return TreeSize(self.max_tree_nodes, wanted - 2)

    def submit(self, call: Callable[[], object]) -> Future:
        """`call` on the worker thread (Open, while the caller drafts)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="edgespec-verify")
        return self._pool.submit(call)

    def draft_from_prompt(self, prompt: Sequence[int], size: TreeSize, left: int, opened: Future | None = None,
                          during: StepRecord | None = None) -> list[Prepared]:
        """While Open is out alone: a tree from the prompt, one level deeper than `size`, whose depth-1 nodes are
        the first tokens the drafter finds likeliest; the one the target picks re-roots it (``match``). `opened`:
        Open's answer to come (a Verdict), whose first token stops the drafting when the tree lacks it; `during`:
        the Open's record (``StepLog.open``)."""
        first = Outcome((), 1.0)
        verdict = None if opened is None else (lambda: opened.result() if opened.done() else None)
        ready = self._draft_for(first, tuple(prompt), size, left,
                                self._stop_when_missed(first, DraftTree((), ()), verdict, []), during)
        return [] if ready is None else [ready]

    def draft_ahead(self, flight: Flight, tokens_left: int) -> list[Prepared]:
        """Trees for the likeliest verdicts on the flight's tree, drafted while it is out, most likely first,
        as long as the verdict has not come and drafting another is likely to pay; each stops at its next pass
        once the verdict is in and rules it out (``StopWhenMissed``). Where nothing stops them (stop_missed off),
        a first tree whose drafting would delay the verdict more than its hit rate pays for is drafted shallower,
        as deep as is likely done before the verdict: that costs nothing, and measures the hit rate.
        `tokens_left`: the tokens the generation still wants, the flight's included."""
        if not (self.planner.pipelined and flight.scores is not None and len(flight.tree)):
            return []
        cfg = self.loop
        prepared: list[Prepared] = []
        for outcome in likely_outcomes(flight.tree, flight.scores, cfg.max_guesses, cfg.min_guess_probability):
            if flight.future.done():
                break
            left = tokens_left - len(outcome.path) - 1  # after the guessed path and its bonus token
            size = self.planner.size(left, explore=False)
            if size.plain:
                continue
            elapsed = self.steps.since_sent(flight.record)
            if not self.planner.worth_drafting_ahead(len(flight.tree), size.depth, elapsed, first=not prepared):
                fits = 0 if prepared else min(size.depth, self.planner.depth_within_flight(len(flight.tree), elapsed))
                if not fits:
                    if not prepared:
                        self.steps.no_guess(flight.record)
                    break
                size = TreeSize(max(fits, size.nodes * fits // size.depth), fits)  # what the flight leaves time for
            context = flight.committed + tuple(flight.tree.tokens[i] for i in outcome.path)
            stop = self._stop_when_missed(outcome, flight.tree, lambda: flight.future.result()
                                          if flight.future.done() else None, prepared)
            ready = self._draft_for(outcome, context, size, left, stop, flight.record)
            if ready is not None:
                prepared.append(ready)
        return prepared

    def _stop_when_missed(self, outcome: Outcome, flight_tree: DraftTree, verdict: Callable[[], Verdict | None] | None,
                          earlier: list[Prepared]) -> "StopWhenMissed | None":
        if verdict is None or not self.loop.stop_missed:
            return None
        return StopWhenMissed(outcome, flight_tree, verdict, tuple(earlier))

    def _draft_for(self, outcome: Outcome, context: tuple[int, ...], size: TreeSize, left: int,
                   stop: "StopWhenMissed | None" = None, during: StepRecord | None = None) -> Prepared | None:
        """A tree drafted ahead from `context` (the text an outcome would leave, before its bonus token): one level
        more than `size` (the bonus token's) and room for the other bonus tokens beside the likeliest. `stop`:
        ``_stop_when_missed``; `during`: the record of the step out meanwhile (None: a record of its own)."""
        request = DraftRequest(context, min(self.max_tree_nodes, size.nodes + max(2, size.nodes // 2)),
                               min(size.depth + 1, left), ahead=True, stop=stop, path_floors=size.floors,
                               free_depth=left)
        tree, took = self.steps.draft_ahead(StepRecord() if during is None else during,
                                            lambda: self.drafter.propose(request),
                                            lambda: stop is not None and stop.fired)
        scores = self.drafter.tree_scores()
        return Prepared(outcome, tree, scores, size, took) if scores is not None and len(tree) else None

    def match(self, prepared: list[Prepared], verdict: Verdict, tree: DraftTree, during: StepRecord | None = None
              ) -> Scored | None:
        """The tree (and its scores) drafted ahead for this verdict on `tree`, if a guess matched it: the verdict
        accepted the guessed path, or more, and the tree drafted ahead holds the rest and the bonus token.
        `during`: the record of the step the verdict answers (None: a record of its own)."""
        if not prepared:
            return None
        during = StepRecord() if during is None else during
        for p in prepared:
            after = sent_after(p, verdict, tree)
            if after is not None:
                self.steps.guessed(during, p.draft_s)
                return after
        self.steps.guessed(during, None)
        return None

    def close(self, flight: Flight | None) -> None:
        """The generation ends: a Draft still out (the caller stopped early) is answered first, then the worker
        stops, so Close never crosses it on the stream."""
        if flight is not None:
            try:
                self._answer(flight)
            except Exception:  # noqa: BLE001 - the output is complete whatever happened to it
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
