"""One verification step as it happened, and the one place that times its phases.

A ``StepRecord`` is a step's figures, filled phase by phase as the step goes: its tree drafted (or drafted
ahead while the step before was out), sent, the drafting done ahead while it is out, its answer landed, the
trees drafted ahead checked against its verdict. ``StepLog`` (one per generation, owned by its
``DraftPipeline``) times each phase, writes the figure into the record, and from the record into both of
its readers: the generation's ``GenerationMetrics`` (what users read: draft_s, idle_s, verify_s, ...) and
the client's ``LoopEstimates`` (what the planner sizes the next trees from). The planner reads the estimates
between phases (the drafting time right after drafting, before trees are drafted ahead), so each phase
writes its figures as it ends, not when the step does.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, TypeVar

from edgespec.shared.metrics import GenerationMetrics
from edgespec.shared.tree import DraftTree

from edgespec.client.link.verifier import Verdict

from .planner import LoopEstimates

T = TypeVar("T")
RECENT_STEPS = 256  # the records a StepLog keeps: a generation's figures are summed as they come, so a long one
# holds only its last steps' records (for reading them: tests, a debugger), never one per step it ran


@dataclass
class StepRecord:
    """One step (the Open, or a Draft) as it happened. Clock readings are ``StepLog.clock`` seconds."""

    step: int = 0  # the Draft's step (0: the Open)
    nodes: int = 0  # the tree sent (0: a plain step, or an Open without a tree)
    ahead: int = 1  # a plain step: the tokens the target was asked to decode on its own (Draft.decode_ahead)
    queued: bool = False  # sent before the answer to the step before it (Draft.queued): its wait is no round trip
    emptied: bool = False  # a tree was drafted for it and the drafter left it empty
    copied: bool = False  # its tree is a copy (Drafter.copy_tree) sent in place of a plain step
    began: float | None = None  # when its work began: its tree's drafting, or its sending if none was drafted then
    draft_s: float = 0.0  # drafting its tree before it went (0: a plain step, or a tree drafted ahead)
    prompt_draft_s: float = 0.0  # the Open: from its start until the first tree from the prompt was drafted
    prompt_nodes: int = 0  # the Open: that tree's nodes (sent with the Open, or kept for the first Draft)
    sent: float | None = None  # when it went
    ahead_s: float = 0.0  # drafting ahead while it was out, for every verdict guessed (hits and misses)
    stopped_ahead: int = 0  # trees drafted ahead that its verdict stopped early
    no_guess: bool = False  # nothing was drafted ahead: the hit rate looked too low to pay
    arrived: float | None = None  # when its answer came, on whichever thread waited for it
    waited_s: float = 0.0  # the client's wait for the answer once it had nothing left to draft (idle)
    server_s: float = 0.0  # the server's own time on it (Timings.total_ns)
    row_cost_s: float = 0.0  # the server's load figures with it: what a row adds to its forwards ...
    sharing: float = 0.0  # ... and the items a forward carried lately (Timings.row_cost_ns, sharing)
    accepted: int = 0  # nodes the target accepted
    decoded: int = 0  # tokens the target decoded ahead before its bonus token
    skipped: bool = False  # a queued step the server skipped (the step before ended short)
    guessed: bool = False  # trees had been drafted ahead for its verdict
    hit: bool = False  # one of them matched the verdict and went out at once
    saved_s: float = 0.0  # that tree's drafting, done while the step was out

    @property
    def round_trip_s(self) -> float | None:
        """Sent to answered, or None where that is no round trip of the link's (a queued step waits behind the
        one before it) or the answer never came."""
        if self.queued or self.sent is None or self.arrived is None:
            return None
        return self.arrived - self.sent


class StepLog:
    """Times one generation's phases into their ``StepRecord`` and writes each figure from the record into the
    metrics and the estimates at once."""

    def __init__(self, metrics: GenerationMetrics, estimates: LoopEstimates,
                 clock: Callable[[], float] = time.perf_counter):
        self.metrics, self.estimates, self.clock = metrics, estimates, clock
        self.records: deque[StepRecord] = deque(maxlen=RECENT_STEPS)  # the last steps sent, in order (the Open's
        # first until RECENT_STEPS more went)
        self._drafted: StepRecord | None = None  # a tree drafted by ``draft``, for the ``send`` that follows

    # ----------------------------------------------------------------- Open
    def open(self) -> StepRecord:
        """The Open begins: its record, its clock running."""
        record = StepRecord(0, began=self.clock())
        self.records.append(record)
        return record

    def prompt_drafted(self, record: StepRecord, prompt_len: int, nodes: int, in_line: bool) -> None:
        """The first tree from the prompt is drafted, `nodes` nodes: in line (the Open waited for it and carries
        it) or while the Open was out alone (its drafting is already counted as drafting ahead)."""
        record.prompt_draft_s, record.prompt_nodes = self.clock() - record.began, nodes
        if in_line:
            record.draft_s, record.nodes = record.prompt_draft_s, nodes
            self.metrics.draft_s += record.draft_s
        self.estimates.observe_open_draft(prompt_len, record.prompt_draft_s, record.prompt_nodes)

    def opened(self, record: StepRecord) -> None:
        """The Open's answer is in: the time to the first token."""
        record.arrived = self.clock()
        self.metrics.prefill_s = record.arrived - record.began

    # ---------------------------------------------------------------- Drafts
    def draft(self, propose: Callable[[], DraftTree]) -> DraftTree:
        """A tree drafted now, for the next ``send``."""
        record = StepRecord(began=self.clock())
        tree = propose()
        record.draft_s, record.emptied = self.clock() - record.began, not len(tree)
        self._drafted = record
        self.metrics.draft_s += record.draft_s
        self.estimates.observe_draft(tree, record.draft_s)
        self.estimates.observe_proposal(record.emptied)
        return tree

    def copy(self, began: float) -> None:
        """A copy, looked up since `began`, goes out next in place of a plain step (``DraftPipeline._copy``)."""
        record = StepRecord(began=began, copied=True)
        record.draft_s = self.clock() - began
        self._drafted = record
        self.metrics.draft_s += record.draft_s
        self.metrics.copy_steps += 1

    def send(self, step: int, nodes: int, ahead: int = 1, queued: bool = False) -> StepRecord:
        """A Draft goes out now: its record (the tree ``draft`` made, unless it was drafted ahead or queued)."""
        record = StepRecord()
        if not queued:
            record, self._drafted = self._drafted or record, None
        record.step, record.nodes, record.ahead, record.queued = step, nodes, ahead, queued
        if not nodes:
            self.metrics.plain_steps += 1
        if queued:
            self.metrics.queued_steps += 1
        record.sent = self.clock()
        if record.began is None:
            record.began = record.sent
        self.records.append(record)
        return record

    def since_sent(self, record: StepRecord) -> float:
        return self.clock() - record.sent

    def draft_ahead(self, record: StepRecord, propose: Callable[[], DraftTree], stopped: Callable[[], bool]
                    ) -> tuple[DraftTree, float]:
        """A tree drafted ahead while `record`'s step is out; returns it and its drafting time. `stopped`: whether
        its verdict stopped it early (asked once it is drafted)."""
        t0 = self.clock()
        tree = propose()
        took = self.clock() - t0
        record.ahead_s += took
        self.metrics.draft_s += took
        self.metrics.draft_ahead_s += took
        if stopped():
            record.stopped_ahead += 1
            self.metrics.stopped_ahead += 1
        return tree, took

    def no_guess(self, record: StepRecord) -> None:
        """Nothing drafted ahead for the step: the hit rate looked too low to pay."""
        record.no_guess = True
        self.estimates.observe_no_guess()

    def answer(self, record: StepRecord, wait: Callable[[], Verdict]) -> Verdict:
        """Wait for the answer (on the worker, or the caller's thread) and note when it came."""
        verdict = wait()
        record.arrived = self.clock()
        return verdict

    def land(self, record: StepRecord, take: Callable[[], Verdict], tree: DraftTree, scores) -> Verdict:
        """The client takes the step's answer (`take` waits for it): its wait is idle time; the verdict's figures
        reach the planner before anything else is drafted. `tree`, `scores`: what was sent, for the estimates."""
        t0 = self.clock()
        try:
            verdict = take()
        finally:  # a wait that ended in a failure was idle too
            record.waited_s = self.clock() - t0
            self.metrics.idle_s += record.waited_s
        t = verdict.timings
        record.server_s, record.row_cost_s, record.sharing = t.total_ns / 1e9, t.row_cost_ns / 1e9, t.sharing
        record.accepted, record.decoded, record.skipped = len(verdict.accepted), len(verdict.decoded), verdict.skipped
        if record.decoded:
            self.estimates.server_decodes_ahead = True
        if not record.skipped:
            self.metrics.verify_s += record.server_s
            self.estimates.observe_verdict(tree, record.accepted, record.round_trip_s, record.server_s,
                                           record.decoded + 1, scores, copy=record.copied)
            self.estimates.observe_load(record.row_cost_s, record.sharing)
        return verdict

    def guessed(self, record: StepRecord, saved_s: float | None) -> None:
        """Trees drafted ahead were checked against the step's verdict; `saved_s`: the drafting of the one that
        matched (None: none did)."""
        record.guessed, record.hit, record.saved_s = True, saved_s is not None, saved_s or 0.0
        self.metrics.guesses += 1
        if record.hit:
            self.metrics.guess_hits += 1
            self.metrics.saved_s += record.saved_s
        self.estimates.observe_guess(record.hit)

    # --------------------------------------------------------------- offline
    def offline(self, generate: Callable[[], T]) -> T:
        """A token the drafter generates alone while the link is down (no step: nothing is sent)."""
        t0 = self.clock()
        token = generate()
        self.metrics.offline_s += self.clock() - t0
        return token
