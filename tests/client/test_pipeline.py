"""The pipelined and adaptive loop writes the serial loop's output: drafting while the Draft is out, trees sized
each step, in float32 greedy token for token (in-process and over gRPC), sampling from the target's
distribution, and offline continuation and resume exact when the link drops while a tree drafted ahead is out.

The drafter that makes guesses hit is the tiny target itself as an independent drafter (its trees are the
target's own likeliest tokens); the tiny drafter of other weights makes them miss. Answers come a few
milliseconds late (InProcessTransport.round_trip_s, or netem's 5g relay) so there is a flight to draft behind.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time

import pytest
import torch

from support.estimates import CopiesPay, DraftingOutlastsFlights, TreesNeverPay
from support.relays import relay_to
from support.stats import chi_square_critical

from edgespec.client.drafters.factory import DrafterOptions, make_drafter
from edgespec.client.drafters.with_lookup import WithLookup
from edgespec.client.link.in_process import InProcessTransport
from edgespec.client.link.verifier import Verifier
from edgespec.client.loop.generation import Generation, GenerationConfig, TokenEvent, TokenizerInfo, TokenOrigin
from edgespec.client.loop.planner import LoopConfig, LoopEstimates
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.verification import target_probs
from edgespec.shared.tree import DraftTree
from edgespec.shared.wire import ResumePolicy

PROMPT = "def add(a, b):\n    return a + b\n"
SERIAL = LoopConfig(pipeline=False, tree="fixed")  # the loop as it was
PIPELINED = LoopConfig(tree="fixed")
AUTO = LoopConfig()  # the default: pipelined, trees sized each step


@pytest.fixture(scope="module")
def drafters(tiny_model_dir, tiny_drafter_dir):
    """ngram; "missing": the tiny drafter (other weights); "hitting": the tiny target drafting for itself."""
    return {"ngram": make_drafter(DrafterOptions(name="ngram")),
            "missing": make_drafter(DrafterOptions(name="independent", model=str(tiny_drafter_dir), dtype="float32")),
            "hitting": make_drafter(DrafterOptions(name="independent", model=str(tiny_model_dir), dtype="float32"))}


@pytest.fixture
def start(core, drafters):
    """start(drafter, loop, estimates=None, round_trip_s=0.005, eos=(), prompt=PROMPT, **config) -> (Generation,
    transport, prompt ids); eos: the client's end-of-output ids."""
    from edgespec.server.rpc.service import VerifierServicer

    tok = core.target.tokenizer

    def make(drafter: str, loop: LoopConfig, estimates=None, round_trip_s: float = 0.005, eos=frozenset(),
             prompt: str = PROMPT, **config):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        info = TokenizerInfo(core.target.fingerprint, set(eos), lambda t: tok.decode(list(t), skip_special_tokens=True))
        transport = InProcessTransport(VerifierServicer(core), round_trip_s=round_trip_s)
        config.setdefault("ignore_eos", True)
        gen = Generation(Verifier(transport), drafters[drafter], ids, GenerationConfig(**config), info,
                         loop=loop, estimates=estimates)
        return gen, transport, ids

    return make


def slow_server() -> LoopEstimates:
    """Estimates that take every verification to last a second: drafting ahead always looks free."""
    return LoopEstimates((0, 255), (1.0, 1.0))


@pytest.mark.parametrize("drafter", ["ngram", "missing", "hitting"])
def test_pipelined_and_auto_write_the_serial_output(start, tiny_target_f32, greedy, drafter):
    want = greedy(tiny_target_f32, start(drafter, SERIAL)[2], 48, set())
    results = {}
    for name, loop in (("serial", SERIAL), ("pipelined", PIPELINED), ("auto", AUTO),
                       ("by-path", LoopConfig(depth_by_path=True))):
        gen, _, _ = start(drafter, loop, slow_server() if name == "pipelined" else None, max_new_tokens=48)
        results[name] = gen.run()
        assert results[name].token_ids == want, name
    assert results["serial"].metrics.guesses == 0
    piped = results["pipelined"].metrics
    if drafter == "hitting":
        assert piped.guesses > 0 and piped.guess_hits > 0 and piped.saved_s > 0
        assert piped.calls == results["serial"].metrics.calls  # the same trees, sent earlier
    if drafter == "missing":
        assert piped.guesses > 0 and piped.guess_hit_rate < 0.5


def slow_prefill() -> LoopEstimates:
    """A server whose prefill of the prompt costs far more than a small tree, and a client that took a second a
    prompt token to draft from its last prompt: Open goes alone while the drafter drafts (open_overlap_pays)."""
    est = LoopEstimates((0, 8, 255), (0.001, 0.001, 10.0))
    est.observe_open_draft(1, 1.0, 4)
    return est


@pytest.mark.parametrize("drafter", ["hitting", "missing"])
def test_open_goes_alone_while_the_drafter_drafts_from_the_prompt(start, tiny_target_f32, greedy, drafter):
    """Where both prefills are long, Open carries no tree: the drafter drafts from the prompt while the server
    prefills, and the tree below the first token the target picks goes out as the first Draft (a guess hit:
    the tiny target drafting for itself). A miss drafts anew. The output is the target's greedy text; the loop
    that does not overlap and a client with nothing measured yet send the tree with Open."""
    want = None
    for loop, est in ((AUTO, slow_prefill()), (LoopConfig(overlap_open=False), slow_prefill()), (AUTO, None)):
        gen, transport, ids = start(drafter, loop, est, max_new_tokens=24)
        sent = recorded(transport)
        r = gen.run()
        want = want or greedy(tiny_target_f32, ids, 24, set())
        assert r.token_ids == want
        alone = not sent[0].open.tree  # the encoded tree: empty bytes without one
        assert alone == (loop.overlap_open and est is not None)
        if alone:
            assert r.metrics.guesses >= 1 and r.metrics.draft_ahead_s > 0
            if drafter == "hitting":  # the first Draft is the tree drafted from the prompt, below the first token
                assert r.metrics.guess_hits >= 1 and sent[1].draft.committed_len == len(ids) + 1
    # a sampled text does not depend on the trees (each token drawn by its position): Open goes alone there too,
    # and the seed's text is the one the loop that keeps the tree with Open and the serial loop write
    texts = []
    for loop, est in ((AUTO, slow_prefill()), (LoopConfig(overlap_open=False), slow_prefill()), (SERIAL, None)):
        gen, transport, _ = start(drafter, loop, est, max_new_tokens=16, sampling=SamplingSettings(temperature=1.0),
                                  seed=3)
        sent = recorded(transport)
        texts.append(gen.run().token_ids)
        assert (not sent[0].open.tree) == (loop is AUTO)
    assert texts[0] == texts[1] == texts[2]
    # a client whose drafter reads prompts in no time (an n-gram) keeps the tree with Open
    quick = LoopEstimates((0, 8, 255), (0.001, 0.001, 10.0))
    quick.observe_open_draft(len(ids), 0.0001, 4)
    assert not quick.open_overlap_pays(len(ids))


@pytest.mark.parametrize("alone", [False, True], ids=["tree-with-open", "open-alone"])
def test_an_output_that_ends_at_its_first_token_sends_no_draft(start, tiny_target_f32, greedy, alone):
    """The target's first token is EOS, and the tree sent with Open was accepted past it (or Open went alone and
    a tree from the prompt waits): the output is that one token and no Draft follows. (Checking for the end
    twice after Open forgot it: the loop went on, and a Draft hung from the cut text was refused.)"""
    gen, transport, ids = start("hitting", AUTO, slow_prefill() if alone else None, max_new_tokens=24)
    first = greedy(tiny_target_f32, ids, 1, set())[0]
    gen, transport, ids = start("hitting", AUTO, slow_prefill() if alone else None, max_new_tokens=24,
                                ignore_eos=False, eos={first})
    sent = recorded(transport)
    r = gen.run()
    assert r.token_ids == [first] and r.finish_reason == "stop"
    assert not any(m.HasField("draft") for m in sent) and bool(sent[0].open.tree) != alone


def test_a_tree_too_deep_to_draft_during_the_flight_is_drafted_shallower(start, tiny_target_f32, greedy):
    """Where nothing stops a tree drafted ahead at a verdict that rules it out (stop_missed off), drafting the
    drafter's own shape ahead would outlast every flight, and the prior hit rate does not pay for the delay: the
    first guess is drafted as deep as the flight leaves time for (3 levels) instead of not at
    all, so the hits are seen. Output: the target's greedy text."""
    gen, _, ids = start("hitting", dataclasses.replace(PIPELINED, stop_missed=False), DraftingOutlastsFlights(),
                        max_new_tokens=40)
    r = gen.run()
    assert r.token_ids == greedy(tiny_target_f32, ids, 40, set())
    # most verdicts had a guess (17 of 19 calls; without it 3, the last few steps, whose trees are shallow anyway)
    assert r.metrics.guesses >= r.metrics.calls // 2 and r.metrics.guess_hits > 0


def test_a_verdict_that_accepts_past_the_guess_still_hits(drafters):
    """The guess was the path to node 0; the target accepted nodes 0 and 1 and picked 8: the tree drafted ahead
    from after node 0 holds 6 -> 8, so what lies below them goes out."""
    from edgespec.client.link.verifier import Verdict
    from edgespec.client.loop.verdict import Outcome
    from edgespec.client.loop.pipeline import DraftPipeline, Prepared
    from edgespec.client.loop.tree_size import TreeSize
    from edgespec.shared.metrics import GenerationMetrics
    from edgespec.shared.tree import ROOT, DraftTree

    pipe = DraftPipeline(None, drafters["ngram"], AUTO, LoopEstimates(), 64, GenerationMetrics())
    flight_tree = DraftTree((5, 6, 3), (ROOT, 0, 1))
    ahead = Prepared(Outcome((0,), 0.5), DraftTree((6, 8, 4, 2), (ROOT, 0, 1, 2)), [-0.1, -0.2, -0.3, -0.4],
                     TreeSize(3, 2), 0.01)
    tree, scores = pipe.match([ahead], Verdict(bonus_token=8, committed_len=0, accepted=(0, 1)), flight_tree)
    assert tree == DraftTree((4, 2), (ROOT, 0)) and scores == pytest.approx([-0.1, -0.2])
    assert pipe.metrics.guess_hits == 1
    assert pipe.match([ahead], Verdict(bonus_token=9, committed_len=0, accepted=(0, 1)), flight_tree) is None
    assert pipe.match([ahead], Verdict(bonus_token=6, committed_len=0, accepted=()), flight_tree) is None


def test_a_tree_drafted_ahead_stops_once_its_verdict_rules_it_out(start, tiny_target_f32):
    """The verdict comes while a tree is drafted ahead (here: at the second question) and did not accept the
    guessed path: the drafting stops before its next pass, with the levels it has. A verdict it may still match
    (the guessed path and the bonus token among the tree's first level) lets it grow to its end."""
    from edgespec.client.drafters.base import DraftRequest
    from edgespec.client.drafters.independent import IndependentConfig, IndependentDrafter
    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.client.link.verifier import Verdict
    from edgespec.client.loop.verdict import Outcome
    from edgespec.client.loop.pipeline import DraftPipeline, StopWhenMissed
    from edgespec.client.loop.tree_size import TreeSize
    from edgespec.shared.metrics import GenerationMetrics
    from edgespec.shared.tree import DraftTree

    # chains with no min_prob stop: only `stop` ends one before its depth (the tiny model's paths are improbable)
    drafter = IndependentDrafter.from_model(tiny_target_f32, IndependentConfig(tree=TreeShape(branch=1, min_prob=0.0)))
    ids = tuple(start("hitting", AUTO)[2])
    pipe = DraftPipeline(None, drafter, AUTO, LoopEstimates(), 64, GenerationMetrics())
    flight = drafter.propose(DraftRequest(ids, 16, 4))
    guess = Outcome((0,), 0.5)
    context = ids + (flight.tokens[0],)
    whole = pipe._draft_for(guess, context, TreeSize(16, 6), 40)
    assert max(whole.tree.depths()) == 7  # nothing stops it: the bonus level and 6 more

    def verdict_at_second_question(verdict):
        asked = []
        return lambda: (asked.append(1), verdict if len(asked) >= 2 else None)[1]

    missed = Verdict(bonus_token=flight.tokens[0], committed_len=0, accepted=())
    stop = StopWhenMissed(guess, flight, verdict_at_second_question(missed), ())
    ready = pipe._draft_for(guess, context, TreeSize(16, 6), 40, stop)
    assert stop.fired and max(ready.tree.depths()) == 2 and pipe.metrics.stopped_ahead == 1
    assert pipe.match([ready], missed, flight) is None
    hit = Verdict(bonus_token=whole.tree.tokens[0], committed_len=0, accepted=(0,))
    stop = StopWhenMissed(guess, flight, verdict_at_second_question(hit), ())
    ready = pipe._draft_for(guess, context, TreeSize(16, 6), 40, stop)
    assert not stop.fired and ready.tree == whole.tree and pipe.metrics.stopped_ahead == 1
    # a second guess stops once the verdict matches the tree drafted for the first
    other = StopWhenMissed(Outcome((), 0.1), flight, lambda: hit, (ready,))
    assert other(DraftTree((), ())) and other.fired


def test_wrong_guesses_stop_at_their_verdict_and_the_output_is_the_targets(start, tiny_target_f32, greedy,
                                                                          monkeypatch):
    """A drafter that misses, slowed to 20 ms a pass so that verdicts come while trees are drafted ahead: those
    trees stop (stopped_ahead), and the text is the target's greedy text, as it is where nothing stops them."""
    from edgespec.client.drafters.independent import IndependentDrafter

    hidden = IndependentDrafter._hidden

    def slow(self, *args, **kwargs):
        time.sleep(0.02)
        return hidden(self, *args, **kwargs)

    monkeypatch.setattr(IndependentDrafter, "_hidden", slow)
    want = greedy(tiny_target_f32, start("missing", SERIAL)[2], 24, set())
    stopped = start("missing", AUTO, max_new_tokens=24)[0].run()
    assert stopped.token_ids == want and stopped.metrics.stopped_ahead >= 1
    assert stopped.metrics.guesses > stopped.metrics.guess_hits
    finished = start("missing", dataclasses.replace(AUTO, stop_missed=False), max_new_tokens=24)[0].run()
    assert finished.token_ids == want and finished.metrics.stopped_ahead == 0


@pytest.mark.parametrize("decode_ahead", [1, 8])
def test_auto_sends_plain_steps_when_trees_lose(start, tiny_target_f32, greedy, decode_ahead):
    """A server where any tree costs 500x a decode step: the planner sends plain steps (empty trees), each asking
    the target for several tokens where the round trip is long beside a decode step. The costs are pinned
    (TreesNeverPay): measured ones follow the machine's load, and under load a tiny model's decode step came
    close enough to loopback's round trip that the steps asked for fewer tokens than this test counts on."""
    gen, _, ids = start("missing", LoopConfig(decode_ahead=decode_ahead), TreesNeverPay(), max_new_tokens=40,
                        logprobs=1)
    r = gen.run()
    assert r.token_ids == greedy(tiny_target_f32, ids, 40, set())
    assert r.metrics.plain_steps > 0 and all(lp is not None for lp in r.logprobs)
    target_tokens = sum(o is TokenOrigin.BONUS for o in r.origins)  # a tree's bonus, or a plain step's tokens
    trees = r.metrics.calls - 1 - r.metrics.plain_steps  # less Open
    if decode_ahead == 1:
        assert target_tokens == trees + r.metrics.plain_steps + 1  # one token a call, and Open's first
    else:
        assert target_tokens > 2 * (trees + r.metrics.plain_steps)
        assert r.metrics.calls < 40 / 3


class CopiesFrom(WithLookup):
    """An +ngram drafter whose copies come from a text the test knows, the target's own greedy output (the tiny
    target's text rarely repeats itself, so a real lookup would find no copy to send): each copy is the next
    `length` tokens of it, the last one made wrong where `wrong` says so (the target then takes the rest)."""

    def __init__(self, base, prompt_len: int, answer: list[int], length: int = 6, wrong=lambda step: False):
        super().__init__(base)
        self.prompt_len, self.answer, self.length, self.wrong, self.copies = prompt_len, answer, length, wrong, 0

    def copy_tree(self, committed, max_nodes, max_depth):
        done = len(committed) - self.prompt_len
        path = list(self.answer[done: done + min(self.length, max_depth, max_nodes)])
        if not path:
            return DraftTree((), ())
        self.copies += 1
        if self.wrong(self.copies):
            path[-1] = (path[-1] + 1) % 64
        return DraftTree.chain(path)


def test_a_copy_goes_in_place_of_a_plain_step(start, drafters, tiny_target_f32, greedy):
    """An +ngram drafter whose model's trees miss, on a server where they lose to plain steps but a copy 3 or
    more deep would not (CopiesPay): the copy goes out in place of the plain step (a tree, never queued), its
    acceptance counted apart from the model's; the output is the target's greedy text whether the copies are
    right or every other one ends wrong, and the loop without copies sends none."""
    results, rates = {}, {}
    for name, loop, wrong in (("right", AUTO, False), ("wrong", AUTO, True), ("none", LoopConfig(copies=False), False)):
        ids = start("missing", loop)[2]
        want = greedy(tiny_target_f32, ids, 48, set())
        drafters["copies"] = CopiesFrom(drafters["missing"], len(ids), want,
                                        wrong=lambda step, wrong=wrong: wrong and step % 2 == 0)
        gen, transport, _ = start("copies", loop, CopiesPay(), max_new_tokens=48)
        sent = recorded(transport)
        r = results[name] = gen.run()
        assert r.token_ids == want, name
        rates[name] = gen.estimates.copy_acceptance()
        if not loop.copies:
            assert r.metrics.copy_steps == 0
            continue
        assert r.metrics.copy_steps >= 3
        assert not any(m.draft.queued for m in sent if m.HasField("draft") and m.draft.tree)
        assert max(gen.estimates.acceptance()) < 0.5  # the model's acceptance: its own trees only
    assert rates["right"] > LoopEstimates.COPY_PRIOR and rates["wrong"] < rates["right"]
    assert results["right"].metrics.calls < results["none"].metrics.calls


def recorded(transport: InProcessTransport, answers: list | None = None) -> list:
    """The messages the server is handed, in order (the in-process server works on one when it is waited for),
    and its answers to them in `answers`."""
    sent, request = [], transport.request

    def record(message):
        sent.append(message)
        answer = request(message)
        if answers is not None:
            answers.append(answer)
        return answer
    transport.request = record
    return sent


@pytest.mark.parametrize("policy", [ResumePolicy.ROLLBACK, ResumePolicy.KEEP], ids=["rollback", "keep"])
def test_the_answer_of_a_step_that_decoded_ahead_is_lost(start, tiny_target_f32, greedy, policy):
    """The server decoded several tokens ahead and committed them, and the answer never came: the loop goes
    offline from the text it had confirmed, and the Resume rolls the server back to it; the output is the
    target's greedy text, nothing lost or doubled."""
    gen, transport, ids = start("hitting", AUTO, TreesNeverPay(), max_new_tokens=40, resume_policy=policy)
    sent = recorded(transport)
    lost = None
    for e in gen:
        if isinstance(e, TokenEvent) and e.index >= 10 and lost is None and gen.metrics.plain_steps >= 2:
            transport.fail_next(1, answered=True)  # the next request: the server commits, the answer is lost
            lost = len(sent)
    r = gen.result
    assert sent[lost].draft.decode_ahead > 1  # the lost one decoded ahead
    assert r.metrics.disconnects == 1 and r.metrics.resumes == 1
    assert r.token_ids == greedy(tiny_target_f32, ids, 40, set()) and r.provisional == 0


def test_plain_steps_queue_behind_each_other(start, tiny_target_f32, greedy):
    """Plain steps in a row go out before the answer to the one before (Draft.queued), each hung from where the
    one before was asked to leave the text; the output is the target's greedy text. The unqueued loop sends the
    same text with no queued Draft."""
    want = None
    for loop in (AUTO, LoopConfig(queue_plain=False)):
        gen, transport, ids = start("missing", loop, TreesNeverPay(), max_new_tokens=40, logprobs=1)
        sent = recorded(transport)
        r = gen.run()
        want = want or greedy(tiny_target_f32, ids, 40, set())
        assert r.token_ids == want and all(lp is not None for lp in r.logprobs)
        drafts = [m.draft for m in sent if m.HasField("draft")]
        queued = [i for i, d in enumerate(drafts) if d.queued]
        assert r.metrics.queued_steps == len(queued)
        if loop.queue_plain:
            assert len(queued) >= 2 and r.metrics.plain_steps > len(queued)  # the first of a run is not queued
            for i in queued:
                before = drafts[i - 1]
                assert not before.tree and drafts[i].step == before.step + 1
                assert drafts[i].committed_len == before.committed_len + max(1, before.decode_ahead)
        else:
            assert not queued and r.metrics.plain_steps > 2


def test_a_plain_step_queues_behind_an_empty_tree_when_most_come_back_empty(start, tiny_target_f32, greedy):
    """The planner wants trees but the n-gram drafter finds no match in most steps (the tiny target's text
    rarely repeats): behind such an empty step a one-token plain step goes out at once; the output is the
    target's greedy text, and every step still drafting its tree from the text keeps the drafter asked."""
    cheap_trees = LoopEstimates((0, 255), (0.001, 0.002))  # trees cost next to nothing: the planner wants them
    gen, transport, ids = start("ngram", AUTO, cheap_trees, max_new_tokens=48)
    sent = recorded(transport)
    r = gen.run()
    assert r.token_ids == greedy(tiny_target_f32, ids, 48, set())
    drafts = [m.draft for m in sent if m.HasField("draft")]
    queued = [i for i, d in enumerate(drafts) if d.queued]
    assert gen.estimates.empty_rate >= 0.5 and len(queued) >= 3 and r.metrics.queued_steps == len(queued)
    behind_empty = [i for i in queued if not drafts[i - 1].queued and not drafts[i - 1].tree
                    and drafts[i - 1].decode_ahead == drafts[i].decode_ahead == 0]
    assert len(behind_empty) >= 3  # one token behind a one-token step whose tree came back empty
    unqueued = start("ngram", LoopConfig(queue_plain=False), cheap_trees, max_new_tokens=48)[0].run()
    assert unqueued.token_ids == r.token_ids and unqueued.metrics.queued_steps == 0


def test_a_queued_step_behind_one_that_stopped_at_eos_is_skipped(start, core, tiny_target_f32, greedy, monkeypatch):
    """The server stops decoding ahead after EOS; a client that ignores EOS (a benchmark of fixed length) had
    queued the next plain step past it: the server skips that one and the loop carries on from the real text."""
    gen, transport, ids = start("missing", AUTO, TreesNeverPay(), max_new_tokens=40)
    want = greedy(tiny_target_f32, ids, 40, set())
    monkeypatch.setattr(core.target, "eos_ids", frozenset(want[12:30]))  # the server's EOS, the client ignores it
    answers = []
    sent = recorded(transport, answers)
    r = gen.run()
    assert r.token_ids == want
    queued = [d for d in (m.draft for m in sent if m.HasField("draft")) if d.queued]
    skipped = [a.verified for a in answers if a.HasField("verified") and a.verified.skipped]
    assert queued and r.metrics.queued_steps == len(queued)
    assert skipped and len(skipped) < len(queued)  # a step queued behind a skipped one is skipped too


@pytest.mark.parametrize("policy", [ResumePolicy.ROLLBACK, ResumePolicy.KEEP], ids=["rollback", "keep"])
def test_link_drops_while_a_tree_drafted_ahead_is_out(start, tiny_target_f32, tiny_drafter_f32, greedy, policy):
    """The link is cut while a tree sent at once for a right guess is on its way: the loop goes offline from
    the text the server confirmed and the Resume ends exactly as the serial loop's would."""
    gen, transport, ids = start("hitting", PIPELINED, slow_server(), round_trip_s=0.02, max_new_tokens=40,
                                resume_policy=policy)
    events, cut_with_flight, offline = [], False, 0
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.origin is not TokenOrigin.OFFLINE and not cut_with_flight \
                and e.index >= 4 and gen._flight is not None:
            transport.cut()  # the tree drafted ahead is in the air
            cut_with_flight = True
        if isinstance(e, TokenEvent) and e.origin is TokenOrigin.OFFLINE:
            offline += 1
            if offline >= 3:
                transport.restore()
    r = gen.result
    assert cut_with_flight and r.metrics.disconnects == 1 and r.metrics.resumes == 1
    assert len(r.token_ids) == 40
    if policy is ResumePolicy.ROLLBACK:
        assert r.token_ids == greedy(tiny_target_f32, ids, 40, set()) and r.provisional == 0
    else:  # the kept offline text is the drafter's (the target itself) from the confirmed text: still greedy
        assert r.token_ids == greedy(tiny_target_f32, ids, 40, set())


@pytest.mark.slow
def test_sampling_keeps_the_targets_distribution(start, tiny_target_f32):
    """Temperature 1, top-k 2: the first four tokens take one of 16 sequences; their counts over many seeds
    under the pipelined loop (trees drafted ahead, guesses hitting and missing) match the target's own
    probabilities of each sequence."""
    sampling = SamplingSettings(temperature=1.0, top_k=2)
    n, runs = 4, 400
    counts: collections.Counter = collections.Counter()
    guesses = 0
    ids = None
    for seed in range(runs):
        gen, _, ids = start("hitting", PIPELINED, slow_server(), round_trip_s=0.002, max_new_tokens=n + 2,
                            sampling=sampling, seed=seed, draft_on_open=False)
        r = gen.run()
        counts[tuple(r.token_ids[:n])] += 1  # the first n tokens' law does not depend on what follows
        guesses += r.metrics.guesses
    assert guesses > 0

    @torch.inference_mode()
    def probs(prefix: list[int]) -> torch.Tensor:
        return target_probs(tiny_target_f32(input_ids=torch.tensor([ids + prefix])).logits[0, -1], sampling)

    expected: dict[tuple, float] = {}
    frontier = [((), 1.0)]
    for _ in range(n):
        nxt = []
        for seq, p in frontier:
            row = probs(list(seq))
            for t in torch.nonzero(row).flatten().tolist():
                nxt.append((seq + (t,), p * float(row[t])))
        frontier = nxt
    expected = dict(frontier)
    assert set(counts) <= set(expected), "a sequence the target cannot sample came out"
    stat = sum((counts.get(s, 0) - runs * p) ** 2 / (runs * p) for s, p in expected.items())
    assert stat < chi_square_critical(len(expected) - 1), (counts, expected)


def test_over_grpc_pipelined_and_auto_write_the_serial_output(tiny_server, make_client, tiny_model_dir,
                                                              tiny_target_f32, greedy):
    """A real server on loopback behind netem's 5g relay: serial, pipelined and auto clients write the same
    tokens, the target's greedy ones; the server reported its cost curve in Info."""
    with relay_to(tiny_server, "5g") as relay:
        outputs, metrics = {}, {}
        for name, loop in (("serial", SERIAL), ("pipelined", PIPELINED), ("auto", AUTO),
                           ("by-path", LoopConfig(depth_by_path=True))):
            client = make_client(relay.target, "independent", drafter_dir=tiny_model_dir)
            assert list(client.info.verify_cost_nodes) == [0, 4, 16, 32]
            assert len(client.info.verify_cost_ns) == 4 and min(client.info.verify_cost_ns) > 0
            client.config = type(client.config)(client.config.link, client.config.drafter,
                                                client.config.tokenizer, loop)
            ids = client.encode(PROMPT)
            r = client.generate(ids, GenerationConfig(max_new_tokens=40, ignore_eos=True))
            outputs[name], metrics[name] = r.token_ids, r.metrics
        assert outputs["serial"] == outputs["pipelined"] == outputs["auto"] == greedy(tiny_target_f32, ids, 40, set())
        assert metrics["pipelined"].guesses > 0 and metrics["serial"].guesses == 0


def cut_once_when(gen, relay, cut: str | None, when) -> bool:
    """Consume the generation; cut the relay (`cut`: "blackhole" or "reset"; None: never) at the first online
    token event for which `when(event)` holds, and restore it after 3 offline tokens. Returns whether it cut."""
    done, offline = False, 0
    for e in gen:
        if not isinstance(e, TokenEvent):
            continue
        if cut and not done and e.origin is not TokenOrigin.OFFLINE and when(e):
            relay.cut(cut)
            done = True
        if e.origin is TokenOrigin.OFFLINE:
            offline += 1
            if offline >= 3 and relay.state != "up":
                relay.restore()
    return done


@contextlib.contextmanager
def behind_5g(server, make_client, drafter_dir, loop: LoopConfig, estimates: LoopEstimates, max_new_tokens: int):
    """A generation of the independent drafter's client, with `loop` and `estimates`, behind netem's 5g relay to
    `server`: (the relay, the prompt's ids, the generation)."""
    with relay_to(server, "5g") as relay:
        client = make_client(relay.target, "independent", drafter_dir=drafter_dir)
        client.config = dataclasses.replace(client.config, loop=loop)
        client.estimates = estimates
        ids = client.encode(PROMPT)
        yield relay, ids, client.generation(ids, GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=True))


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["blackhole", "reset"])
def test_relay_outage_while_a_tree_drafted_ahead_is_out(tiny_server, make_client, tiny_model_dir, tiny_target_f32,
                                                        greedy, cut):
    """netem's relay drops the link while the tree sent at once for a right guess is on its way: offline,
    reconnect, Resume, and the output is the target's greedy text (rollback)."""
    with behind_5g(tiny_server, make_client, tiny_model_dir, PIPELINED, slow_server(), 40) as (relay, ids, gen):
        cut_with_flight = cut_once_when(gen, relay, cut, lambda e: e.index >= 4 and gen._flight is not None)
        r = gen.result
    assert cut_with_flight and r.metrics.disconnects >= 1 and r.metrics.resumes >= 1
    assert r.token_ids == greedy(tiny_target_f32, ids, 40, set()) and r.provisional == 0
    assert r.metrics.guess_hits > 0


@pytest.mark.parametrize("cut", [None, "blackhole"])
def test_over_grpc_queued_plain_steps_write_the_targets_text(tiny_server, make_client, tiny_model_dir,
                                                             tiny_target_f32, greedy, cut):
    """A real server on loopback behind netem's 5g relay, a client whose planner takes plain steps: they go out
    queued, two on the stream at a time, and the output is the target's greedy text; with the link cut while a
    queued step is out (both Drafts lost), the loop goes offline, resumes and stays exact."""
    with behind_5g(tiny_server, make_client, tiny_model_dir, AUTO, TreesNeverPay(), 48) as (relay, ids, gen):
        cut_done = cut_once_when(gen, relay, cut, lambda e: gen._flight is not None and gen._flight.queued)
        r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 48, set()) and r.provisional == 0
    assert r.metrics.queued_steps >= 2
    if cut:
        assert cut_done and r.metrics.disconnects >= 1 and r.metrics.resumes >= 1
