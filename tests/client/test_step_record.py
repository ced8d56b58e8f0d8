"""Each step's figures are measured once, into its StepRecord, and both readers get them from there: a real
generation over the in-process verifier (tiny float32 target) writes the target's greedy text, and the metrics
users read and the figures the planner's estimates were handed add up to the same records, step by step.

The estimates are real ``LoopEstimates`` that also keep what they were handed (``Witness``); the loops are the
pipelined one whose guesses hit (the tiny target drafting for itself, trees drafted ahead while each Draft is
out), and the adaptive one on a server where trees never pay (plain steps, queued behind each other).
"""
from __future__ import annotations

import pytest
from support.estimates import TreesNeverPay

from edgespec.client.drafters.factory import DrafterOptions, make_drafter
from edgespec.client.link.in_process import InProcessTransport
from edgespec.client.link.verifier import Verdict, Verifier
from edgespec.client.loop.generation import Generation, GenerationConfig, TokenizerInfo
from edgespec.client.loop.planner import LoopConfig, LoopEstimates
from edgespec.client.loop.step_record import RECENT_STEPS, StepLog, StepRecord
from edgespec.shared.metrics import GenerationMetrics
from edgespec.shared.session_contract import ServerTimings
from edgespec.shared.tree import ROOT, DraftTree

PROMPT = "def add(a, b):\n    return a + b\n"


class Witness(LoopEstimates):
    """Real estimates that also keep every figure handed to them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drafts: list[float] = []
        self.verdicts: list[tuple] = []  # (nodes, accepted, round trip, server s, decoded)
        self.loads: list[tuple[float, float]] = []
        self.guesses: list[bool] = []
        self.open_drafts: list[tuple[int, float, int]] = []

    def observe_draft(self, tree, seconds):
        self.drafts.append(seconds)
        super().observe_draft(tree, seconds)

    def observe_verdict(self, tree, accepted, round_trip_s, server_s, decoded=1, scores=None, copy=False):
        self.verdicts.append((len(tree), accepted, round_trip_s, server_s, decoded))
        super().observe_verdict(tree, accepted, round_trip_s, server_s, decoded, scores, copy)

    def observe_load(self, row_cost_s, sharing):
        self.loads.append((row_cost_s, sharing))
        super().observe_load(row_cost_s, sharing)

    def observe_guess(self, hit):
        self.guesses.append(hit)
        super().observe_guess(hit)

    def observe_open_draft(self, prompt_len, seconds, nodes):
        self.open_drafts.append((prompt_len, seconds, nodes))
        super().observe_open_draft(prompt_len, seconds, nodes)


class NeverPayWitness(Witness, TreesNeverPay):
    """A Witness of a server where trees never pay: plain steps, queued."""


@pytest.fixture(scope="module")
def drafters(tiny_model_dir, tiny_drafter_dir):
    """"hitting": the tiny target drafting for itself (guesses hit); "missing": the tiny drafter (other weights)."""
    return {"hitting": make_drafter(DrafterOptions(name="independent", model=str(tiny_model_dir), dtype="float32")),
            "missing": make_drafter(DrafterOptions(name="independent", model=str(tiny_drafter_dir), dtype="float32"))}


def generate(core, drafter, loop: LoopConfig, estimates: LoopEstimates, max_new_tokens: int = 40):
    from edgespec.server import VerifierServicer  # the server's public face, wherever the module lives

    tok = core.target.tokenizer
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    info = TokenizerInfo(core.target.fingerprint, set(), lambda t: tok.decode(list(t), skip_special_tokens=True))
    transport = InProcessTransport(VerifierServicer(core), round_trip_s=0.005)  # a flight to draft behind
    gen = Generation(Verifier(transport), drafter, ids, GenerationConfig(max_new_tokens=max_new_tokens,
                                                                         ignore_eos=True), info, loop=loop,
                     estimates=estimates)
    return gen, gen.run(), ids


CASES = {
    "pipelined": ("hitting", LoopConfig(tree="fixed"), lambda: Witness((0, 255), (1.0, 1.0))),  # drafting ahead
    # always looks free beside a second's verification
    "plain": ("missing", LoopConfig(), NeverPayWitness),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_metrics_and_the_estimates_read_the_same_records(core, drafters, tiny_target_f32, greedy, case):
    drafter, loop, make_estimates = CASES[case]
    est = make_estimates()
    gen, result, ids = generate(core, drafters[drafter], loop, est)
    assert result.token_ids == greedy(tiny_target_f32, ids, 40, set())
    m, records = result.metrics, list(gen.pipe.steps.records)
    assert len(records) < RECENT_STEPS  # every step's record is still there
    opening, drafts = records[0], records[1:]

    # one record a step: the Open's, then one for every Draft the server answered, numbered as sent
    assert opening.step == 0 and [r.step for r in drafts] == list(range(1, len(drafts) + 1))
    assert m.calls == len(records) and all(r.arrived is not None and r.arrived >= r.sent for r in drafts)
    landed = [r for r in drafts if not r.skipped]
    assert m.num_verifications == len(landed) + (opening.nodes > 0)

    # drafting: each tree drafted in line went to the estimates as the very figure its record holds; the metrics'
    # total is those, the Open's and every tree drafted ahead
    assert est.drafts == [r.draft_s for r in drafts if r.draft_s]
    assert est.open_drafts == [(len(ids), opening.prompt_draft_s, opening.prompt_nodes)]
    assert m.draft_s == pytest.approx(sum(r.draft_s + r.ahead_s for r in records), rel=1e-9)
    assert m.draft_ahead_s == pytest.approx(sum(r.ahead_s for r in records), rel=1e-9)
    assert m.prefill_s == opening.arrived - opening.began > 0

    # the answers: the client's waits are its idle time; the server's time and load and the round trips (none for
    # a queued step) are the estimates' verdicts
    assert m.idle_s == pytest.approx(sum(r.waited_s for r in drafts), rel=1e-9)
    assert m.verify_s == pytest.approx(sum(r.server_s for r in landed), rel=1e-9)
    assert est.verdicts == [(r.nodes, r.accepted, r.round_trip_s, r.server_s, r.decoded + 1) for r in landed]
    assert est.loads == [(r.row_cost_s, r.sharing) for r in landed]
    assert all((r.round_trip_s is None) == r.queued for r in landed)

    # the kinds of step and the guesses
    assert m.plain_steps == sum(not r.nodes for r in drafts) and m.queued_steps == sum(r.queued for r in drafts)
    assert est.guesses == [r.hit for r in records if r.guessed] and m.guesses == len(est.guesses)
    assert m.guess_hits == sum(est.guesses) and m.saved_s == pytest.approx(sum(r.saved_s for r in records))
    assert m.stopped_ahead == sum(r.stopped_ahead for r in records)
    if case == "pipelined":
        assert m.guess_hits > 0 and m.draft_ahead_s > 0 and not m.plain_steps
    else:
        assert m.queued_steps >= 2 and m.plain_steps > m.queued_steps  # the first of a run is not queued


def test_a_queued_step_is_no_round_trip_and_a_skipped_one_teaches_nothing():
    """StepLog alone, on a clock that ticks a second a reading: the idle wait, the round trip and what reaches
    each reader follow from the record, a queued step's wait is no round trip and a skipped step's answer is
    nobody's figure."""
    ticks = iter(range(100))
    metrics, est = GenerationMetrics(), Witness()
    steps = StepLog(metrics, est, clock=lambda: float(next(ticks)))
    tree = DraftTree((5, 6), (ROOT, 0))
    drafted = steps.draft(lambda: tree)  # began at 0, drafted at 1
    first = steps.send(1, len(drafted))  # sent at 2
    queued = steps.send(2, 0, ahead=4, queued=True)  # sent at 3
    answer = Verdict(bonus_token=7, committed_len=10, accepted=(0,), timings=ServerTimings(total_ns=500_000_000))
    # the wait begins at 4; the answer comes at 5; the wait ends at 6
    assert steps.land(first, lambda: steps.answer(first, lambda: answer), tree, None) is answer
    assert (first.draft_s, first.round_trip_s, first.waited_s, first.server_s) == (1.0, 3.0, 2.0, 0.5)
    skipped = Verdict(bonus_token=0, committed_len=10, skipped=True)
    steps.land(queued, lambda: steps.answer(queued, lambda: skipped), DraftTree((), ()), None)
    assert queued.round_trip_s is None and queued.skipped and queued.waited_s == 2.0
    assert est.drafts == [1.0] and est.verdicts == [(2, 1, 3.0, 0.5, 1)]
    assert (metrics.draft_s, metrics.idle_s, metrics.verify_s) == (1.0, 4.0, 0.5)
    assert (metrics.plain_steps, metrics.queued_steps) == (1, 1)
    assert list(steps.records) == [first, queued] and isinstance(first, StepRecord)


def test_a_long_generation_keeps_only_its_last_steps_records():
    """The records are bounded: after many steps the log holds the last RECENT_STEPS, in order, while the metrics
    and the estimates still count every step."""
    ticks = iter(range(10 * RECENT_STEPS))
    metrics, est = GenerationMetrics(), Witness()
    steps = StepLog(metrics, est, clock=lambda: float(next(ticks)))
    tree = DraftTree((5,), (ROOT,))
    answer = Verdict(bonus_token=7, committed_len=10, accepted=(0,), timings=ServerTimings(total_ns=1_000_000))
    total = RECENT_STEPS + 40
    for step in range(1, total + 1):
        record = steps.send(step, len(steps.draft(lambda: tree)))
        steps.land(record, lambda: steps.answer(record, lambda: answer), tree, None)
    assert len(steps.records) == RECENT_STEPS
    assert [r.step for r in steps.records] == list(range(total - RECENT_STEPS + 1, total + 1))
    assert len(est.drafts) == len(est.verdicts) == total and metrics.verify_s == pytest.approx(total * 1e-3)
