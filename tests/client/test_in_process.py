"""The generation loop against a verifier in this process: a real VerifierCore over the tiny target, no sockets.

The offline / resume state machine, step by step: the link fails exactly where a
test says (before a request arrives, after the server handled it, for several
tries in a row, from the start), and every output is checked token for token
against the target's greedy output, the event stream replayed against it.
"""
from __future__ import annotations

import pytest
import torch

from edgespec.client.drafters.factory import DrafterOptions, make_drafter
from edgespec.client.loop.generation import (Generation, GenerationConfig, GenerationFailedError, LinkEvent,
                                             LogprobsEvent, RetractEvent, TokenEvent, TokenizerInfo, TokenOrigin)
from edgespec.client.link.in_process import InProcessTransport
from edgespec.client.link.verifier import LinkDownError, Verifier
from edgespec.client.text import SettledTokens
from edgespec.shared.wire import ResumePolicy

PROMPT = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def drafters(tiny_drafter_dir):
    """One drafter of each kind for the module, as a client keeps one across its generations."""
    return {name: make_drafter(DrafterOptions(name=name, model=str(tiny_drafter_dir), dtype="float32"))
            for name in ("ngram", "independent")}


@pytest.fixture
def start(core, drafters):
    """start(drafter, fingerprint=None, **config) -> (Generation, InProcessTransport, prompt ids)."""
    from edgespec.server.rpc.service import VerifierServicer

    tok = core.target.tokenizer
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]

    def make(drafter: str = "independent", fingerprint: str | None = None, **config):
        info = TokenizerInfo(fingerprint or core.target.fingerprint, set(),
                             lambda t: tok.decode(list(t), skip_special_tokens=True))
        transport = InProcessTransport(VerifierServicer(core))
        config.setdefault("ignore_eos", True)
        gen = Generation(Verifier(transport), drafters[drafter], ids, GenerationConfig(**config), info)
        return gen, transport, ids

    return make


def replay(events) -> list[int]:
    """Apply the events as a streaming caller would; checks indices on the way."""
    out: list[int] = []
    for e in events:
        if isinstance(e, TokenEvent):
            assert e.index == len(out)
            out.append(e.token)
        elif isinstance(e, RetractEvent):
            assert e.index == len(out) - e.count
            del out[e.index:]
    return out


def cut_at(gen, transport, at: int, offline: int | None) -> list:
    """Iterate gen; cut the link once `at` tokens are out online; restore it after `offline` offline
    tokens (None: never). Returns the events."""
    events, seen, cut = [], 0, False
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.origin is not TokenOrigin.OFFLINE and e.index + 1 >= at and not cut:
            transport.cut()
            cut = True
        if isinstance(e, TokenEvent) and e.origin is TokenOrigin.OFFLINE:
            seen += 1
            if offline is not None and seen >= offline:
                transport.restore()
    return events


@pytest.mark.parametrize("drafter", ["ngram", "independent"])
def test_greedy_equals_target(start, tiny_target_f32, greedy, drafter):
    gen, _, ids = start(drafter, max_new_tokens=40)
    r = gen.run()
    assert r.token_ids == greedy(tiny_target_f32, ids, 40, set())
    m = r.metrics
    assert m.calls in (m.num_verifications, m.num_verifications + 1) and m.disconnects == 0
    # + the Close; a queued plain step has no round trip of its own
    assert m.bytes_up > 0 and m.bytes_down > 0 and len(m.round_trips_s) == m.calls + 1 - m.queued_steps


@pytest.mark.parametrize("policy", [ResumePolicy.ROLLBACK, ResumePolicy.KEEP], ids=["rollback", "keep"])
def test_resume_after_an_outage(start, tiny_target_f32, greedy, policy):
    gen, transport, ids = start(max_new_tokens=40, resume_policy=policy)
    events = cut_at(gen, transport, at=5, offline=4)
    r = gen.result
    assert replay(events) == r.token_ids and len(r.token_ids) == 40
    offline = [e for e in events if isinstance(e, TokenEvent) and e.origin is TokenOrigin.OFFLINE]
    assert len(offline) >= 4 and r.metrics.disconnects == 1 and r.metrics.resumes == 1
    back = [e for e in events if isinstance(e, LinkEvent) and e.online]
    assert len(back) == 1 and "session kept" in back[0].detail
    if policy is ResumePolicy.ROLLBACK:  # exactly the target's text, whatever the drafter made offline
        assert r.token_ids == greedy(tiny_target_f32, ids, 40, set())
        assert r.metrics.offline_tokens == 0 and r.provisional == 0
    else:  # the offline text stands where it was emitted; the target continues from it
        assert not any(isinstance(e, RetractEvent) for e in events)
        for e in offline:
            assert r.token_ids[e.index] == e.token
        k = offline[-1].index + 1
        assert r.token_ids[:5] == greedy(tiny_target_f32, ids, 5, set())
        assert r.token_ids[k:] == greedy(tiny_target_f32, ids + r.token_ids[:k], 40 - k, set())


@pytest.mark.parametrize("answered", [False, True])
def test_a_draft_lost_on_the_way_there_or_back(start, tiny_target_f32, greedy, answered):
    """The link fails on one Draft: before the server saw it, or after it verified it and moved the session
    on (only its answer was lost). Resume finds the session either way and the output is unchanged."""
    gen, transport, ids = start(max_new_tokens=30)
    events = []
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.index == 6:
            transport.fail_next(answered=answered)
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 30, set()) and replay(events) == r.token_ids
    assert r.metrics.disconnects == 1 and r.metrics.resumes == 1
    link = [e for e in events if isinstance(e, LinkEvent)]
    assert [e.online for e in link] == [False, True] and "session kept" in link[1].detail


def test_failed_resumes_are_one_outage(start, tiny_target_f32, greedy):
    """A Draft and then two Resumes fail in a row: one outage announced once, three failures counted."""
    gen, transport, ids = start(max_new_tokens=30)
    events = []
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.index == 4:
            transport.fail_next(3)
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 30, set()) and replay(events) == r.token_ids
    assert [e.online for e in events if isinstance(e, LinkEvent)] == [False, True]
    assert r.metrics.disconnects == 3 and r.metrics.resumes == 1


def test_session_lost_on_the_server_is_rebuilt(start, core, tiny_target_f32, greedy):
    gen, _, ids = start(max_new_tokens=30)
    events = []
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.index == 8 and not any(isinstance(x, LinkEvent) for x in events):
            core.close(gen.session_id)
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 30, set()) and replay(events) == r.token_ids
    back = [e for e in events if isinstance(e, LinkEvent) and e.online]
    assert len(back) == 1 and "re-prefilled" in back[0].detail


def test_offline_from_the_start_then_the_server_appears(start, tiny_target_f32, greedy):
    """Open never arrives: the drafter generates from the prompt; Resume then builds the session from it."""
    gen, transport, ids = start(max_new_tokens=20)
    transport.cut()
    events = []
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.index == 3:
            transport.restore()
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 20, set()) and replay(events) == r.token_ids
    assert events[0] == LinkEvent(False, events[0].detail) and r.metrics.resumes == 1
    back = [e for e in events if isinstance(e, LinkEvent) and e.online]
    assert "re-prefilled" in back[0].detail and "agreed with" in back[0].detail


def test_the_link_never_comes_back(start, tiny_target_f32, greedy):
    """Rollback with the output finished offline: the loop waits offline_wait_s, then ends with its text."""
    gen, transport, ids = start(max_new_tokens=15, offline_wait_s=0.2)
    events = cut_at(gen, transport, at=4, offline=None)
    r = gen.result
    assert len(r.token_ids) == 15 and r.provisional > 0 and "stay unverified" in r.detail
    assert replay(events) == r.token_ids
    verified = 15 - r.provisional
    assert r.token_ids[:verified] == greedy(tiny_target_f32, ids, verified, set())


def test_ngram_cannot_start_without_the_server(start):
    gen, transport, _ = start("ngram", max_new_tokens=10)
    transport.cut()
    with pytest.raises(LinkDownError, match="cannot start without the server"):
        gen.run()


def test_a_refusal_fails_the_generation_with_the_servers_message(start):
    gen, _, _ = start("ngram", fingerprint="0" * 64, max_new_tokens=10)
    with pytest.raises(GenerationFailedError) as info:
        gen.run()
    assert info.value.grpc_code == "FAILED_PRECONDITION" and "tokenizer fingerprint" in str(info.value)
    assert info.value.result.token_ids == [] and info.value.result.finish_reason == "error"


@torch.inference_mode()
def target_logprobs(model, ids: list[int], generated: list[int], top: int) -> list[tuple[float, list[int]]]:
    """The target's raw log-probability of each generated token and its `top` most likely ids, from one
    full forward pass over the text (no cache, no tree)."""
    logits = model(input_ids=torch.tensor([ids + generated])).logits[0, len(ids) - 1: len(ids) - 1 + len(generated)]
    lp = torch.log_softmax(logits.float(), dim=-1)
    return [(float(lp[i, t]), lp[i].topk(top).indices.tolist()) for i, t in enumerate(generated)]


def assert_target_logprobs(model, ids, tokens, logprobs, top=3):
    want = target_logprobs(model, ids, tokens, top)
    assert len(logprobs) == len(tokens)
    for i, (got, (lp, best)) in enumerate(zip(logprobs, want)):
        assert got is not None, f"token {i} has no logprob"
        assert got.logprob == pytest.approx(lp, abs=1e-4), i
        assert [t for t, _ in got.top] == best, i


@pytest.mark.parametrize("drafter", ["ngram", "independent"])
def test_logprobs_are_the_targets_for_every_committed_token(start, tiny_target_f32, drafter):
    """Open with a tree (ngram) or without, then Drafts: one logprob per token, equal to the target's own."""
    gen, _, ids = start(drafter, max_new_tokens=40, logprobs=3)
    events = list(gen)
    r = gen.result
    assert_target_logprobs(tiny_target_f32, ids, r.token_ids, r.logprobs)
    assert [e.logprob for e in events if isinstance(e, TokenEvent)] == r.logprobs
    if drafter == "ngram":  # the tiny independent drafter rarely agrees with the tiny target; ngram does here
        assert r.metrics.num_accepted_tokens > 0  # so some came from deep rows of a tree, not only bonus rows


def test_no_logprobs_unless_asked(start):
    gen, _, _ = start("ngram", max_new_tokens=10)
    assert gen.run().logprobs == [] and all(e.logprob is None for e in start("ngram", max_new_tokens=5)[0]
                                            if isinstance(e, TokenEvent))


@pytest.mark.parametrize("policy", [ResumePolicy.ROLLBACK, ResumePolicy.KEEP], ids=["rollback", "keep"])
def test_a_resume_scores_the_offline_tokens_it_keeps(start, tiny_target_f32, policy):
    """Offline tokens have no logprob until Resume: then the target's, for the ones kept (under `keep` every
    one, even those the target would not have chosen). A caller holding them back emits them scored."""
    gen, transport, ids = start(max_new_tokens=40, resume_policy=policy, logprobs=3)
    events = cut_at(gen, transport, at=5, offline=6)
    r = gen.result
    assert replay(events) == r.token_ids
    assert_target_logprobs(tiny_target_f32, ids, r.token_ids, r.logprobs)
    offline = [e for e in events if isinstance(e, TokenEvent) and e.origin is TokenOrigin.OFFLINE]
    assert offline and all(e.logprob is None for e in offline)
    scored = [e for e in events if isinstance(e, LogprobsEvent)]
    if policy is ResumePolicy.KEEP:
        assert len(scored) == 1 and scored[0].index == offline[0].index and len(scored[0].logprobs) == len(offline)
    settled = SettledTokens(hold_offline=True)
    out = [t for e in events for t in settled.feed(e)] + settled.finish()
    assert [t.token for t in out] == r.token_ids and [t.logprob for t in out] == r.logprobs


def test_tokens_the_target_never_saw_have_no_logprob(start, tiny_target_f32):
    gen, transport, ids = start(max_new_tokens=15, offline_wait_s=0.2, logprobs=0)
    cut_at(gen, transport, at=4, offline=None)
    r = gen.result
    verified = 15 - r.provisional
    assert r.provisional > 0 and r.logprobs[verified:] == [None] * r.provisional
    assert_target_logprobs(tiny_target_f32, ids, r.token_ids[:verified], r.logprobs[:verified], top=0)


@pytest.mark.parametrize("policy", [ResumePolicy.ROLLBACK, ResumePolicy.KEEP], ids=["rollback", "keep"])
def test_an_end_reached_offline_and_confirmed_by_the_resume_stays_the_end(core, tiny_model_dir, tiny_target_f32,
                                                                           greedy, policy):
    """The target itself drafts offline, so the Resume agrees with every offline token, EOS included: the
    output ends at that EOS, with nothing of the target's after it."""
    from edgespec.server.rpc.service import VerifierServicer

    tok = core.target.tokenizer
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    reference = greedy(tiny_target_f32, ids, 40, set())
    k = next(i for i in range(8, 40) if reference[i] not in reference[:i])  # an id first seen at i: the EOS
    info = TokenizerInfo(core.target.fingerprint, {reference[k]}, lambda t: tok.decode(list(t)))
    transport = InProcessTransport(VerifierServicer(core))
    same = make_drafter(DrafterOptions(name="independent", model=str(tiny_model_dir), dtype="float32"))
    gen = Generation(Verifier(transport), same, ids, GenerationConfig(max_new_tokens=40, resume_policy=policy),
                     info)
    events = []
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.origin is TokenOrigin.BONUS and e.index >= 2:
            transport.cut()  # from here on the target drafts alone, up to the EOS
        if isinstance(e, TokenEvent) and e.origin is TokenOrigin.OFFLINE and e.token == reference[k]:
            transport.restore()
    r = gen.result
    assert any(isinstance(e, TokenEvent) and e.origin is TokenOrigin.OFFLINE for e in events)
    assert r.metrics.resumes == (1 if policy is ResumePolicy.ROLLBACK else 0)  # keep: the end stands unverified
    assert r.token_ids == reference[:k + 1] and r.finish_reason == "stop"
    assert replay(events) == r.token_ids
