"""VerifierSession on the tiny target, without gRPC: greedy exactness over random trees and KV bookkeeping.

Every test runs on each device (cpu, and cuda where there is one) and on both engines (generic:
a DynamicCache per session; batched: a slot of the pre-allocated pool).
"""
from __future__ import annotations

import random

import pytest
import torch
from support.greedy import recomputed_greedy

from edgespec.server.session import VerifierSession
from edgespec.shared.wire import ResumePolicy
from edgespec.server.target import TargetModel
from edgespec.shared.codec import decode_frame
from edgespec.shared.drafters.moa.lsa import LayerSelfAttention, LSAConfig
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.models.loading import load_model
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.session_settings import FeatureRequest, SessionSettings
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.wire import FeatureKind

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module", params=DEVICES)
def target(request, tiny_model_dir) -> TargetModel:
    return TargetModel(load_model(str(tiny_model_dir), device=request.param, dtype="float32"))


@pytest.fixture(scope="module")
def greedy_reference(target):
    """ids, n -> this module's target's own greedy continuation of n tokens (full recompute, on its device)."""
    return lambda ids, n: recomputed_greedy(target.model, ids, n)


def make_session(target, scheduler, sampling=SamplingSettings(), features=FeatureRequest(), seed=0, lsa=None):
    settings = SessionSettings("test", sampling, seed, features)
    return VerifierSession(settings, target, scheduler, max_context_tokens=1024, lsa=lsa)


def random_tree(rng: random.Random, truth: list[int], vocab: int = 300) -> DraftTree:
    """A random tree that follows `truth` for a random number of steps, with random siblings and branches."""
    tokens: list[int] = []
    parents: list[int] = []

    def add(token: int, parent: int) -> int:
        tokens.append(token)
        parents.append(parent)
        return len(tokens) - 1

    parent = ROOT
    for depth in range(rng.randint(0, min(len(truth), 6))):
        for _ in range(rng.randint(0, 2)):
            add(rng.randrange(vocab), parent)
        node = add(truth[depth], parent)
        for _ in range(rng.randint(0, 2)):
            add(rng.randrange(vocab), parent)
        parent = node
    for _ in range(rng.randint(0, 4)):
        add(rng.randrange(vocab), rng.choice([ROOT] + list(range(len(tokens)))))
    return DraftTree(tuple(tokens), tuple(parents)).validate()


@torch.inference_mode()
def fresh_next_logits(target, ids: list[int]) -> torch.Tensor:
    """[V] on the CPU, by a plain forward without a cache."""
    return target.model(input_ids=torch.tensor([ids], device=target.device)).logits[0, -1].float().cpu()


@torch.inference_mode()
def session_next_logits(session) -> torch.Tensor:
    """The next-token logits the session's KV gives for its committed text (KV left as it was): [V] on the CPU."""
    past = len(session.committed) - 1
    scheduler = session.scheduler
    out = scheduler.run_job(scheduler.forward_tree(session.kv, session.committed[-1], DraftTree((), ())), session.kv)
    session.kv.crop(past)
    return out.logits[0].cpu()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_random_trees_commit_the_target_greedy_continuation(target, scheduler, greedy_reference, seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(256) for _ in range(rng.randint(3, 12))]
    truth = greedy_reference(prompt, 60)
    session = make_session(target, scheduler)
    opened = session.open(prompt)
    assert opened.next_token == truth[0] and opened.committed_len == len(prompt) + 1
    step = 0
    while len(session.committed) - len(prompt) < 50:
        done = len(session.committed) - len(prompt)
        tree = random_tree(rng, truth[done:])
        step += 1
        result = session.verify(step, len(session.committed), tree)
        assert result.committed_len == len(session.committed)
        assert session.committed[len(prompt):] == truth[:len(session.committed) - len(prompt)]
    # After many cycles the cache gives what a fresh prefill of the committed text gives.
    assert torch.allclose(session_next_logits(session), fresh_next_logits(target, session.committed), atol=1e-4)
    assert len(session.kv) == len(session.committed) - 1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_open_with_a_tree_verifies_it_in_the_prefill_pass(target, scheduler, greedy_reference, seed):
    """Open + tree = Open then Draft: same committed text, same cache, features for prompt + accepted nodes."""
    rng = random.Random(seed)
    prompt = [rng.randrange(256) for _ in range(rng.randint(1, 12))]
    truth = greedy_reference(prompt, 20)
    tree = random_tree(rng, truth)
    session = make_session(target, scheduler, features=FeatureRequest(FeatureKind.LAST_HIDDEN))
    opened = session.open(prompt, tree)
    accepted = [tree.tokens[i] for i in opened.accepted]
    assert accepted + [opened.next_token] == truth[:len(accepted) + 1]
    assert opened.committed_len == len(prompt) + len(accepted) + 1 == len(session.committed)
    assert len(session.kv) == len(session.committed) - 1
    assert torch.allclose(session_next_logits(session), fresh_next_logits(target, session.committed), atol=1e-4)
    (name, frame), = opened.features
    assert decode_frame(frame).shape[0] == len(prompt) + len(accepted)
    # the session goes on like any other
    result = session.verify(1, len(session.committed), DraftTree((), ()))
    assert session.committed[len(prompt):] == truth[:len(session.committed) - len(prompt)]
    assert result.committed_len == len(session.committed)


def test_sampling_sessions_keep_the_kv_of_the_accepted_path(target, scheduler):
    rng = random.Random(5)
    session = make_session(target, scheduler, SamplingSettings(temperature=1.0, top_p=0.95), seed=3)
    prompt = [rng.randrange(256) for _ in range(6)]
    session.open(prompt)
    accepted_total = 0
    for step in range(1, 30):
        # drafts from the target's own top tokens, so some get accepted under sampling
        logits = session_next_logits(session)
        top = torch.topk(logits, 3).indices.tolist()
        tree = DraftTree((top[1], top[0], top[2]), (ROOT, ROOT, 1))
        result = session.verify(step, len(session.committed), tree)
        accepted_total += len(result.accepted)
    assert accepted_total > 0
    assert torch.allclose(session_next_logits(session), fresh_next_logits(target, session.committed), atol=1e-4)


def test_a_seed_gives_one_sampled_text_whatever_trees_plain_steps_and_resumes_carry_it(target, scheduler):
    """Each token is drawn with a number keyed by (seed, its position): the text of a seed is the plain API's
    with that seed, through trees of any shape (the target's own top tokens, so some are accepted), plain steps,
    decoding ahead, and a resume that rolls back; another seed writes another text."""
    from edgespec.server.decoder import GenerationRequest, generate

    sampling, n = SamplingSettings(temperature=1.0, top_k=50), 24
    rng = random.Random(8)
    prompt = [rng.randrange(256) for _ in range(6)]
    plain = [t.id for t in generate(target, scheduler, GenerationRequest(tuple(prompt), n, sampling, 5,
                                                                        stop_at_eos=False))]
    texts = []
    for shape in range(3):
        session = make_session(target, scheduler, sampling, seed=5)
        first = session.open(prompt, DraftTree((7,), (ROOT,)) if shape == 1 else None)
        step, accepted = 1, len(first.accepted)
        while len(session.committed) < len(prompt) + n:
            top = torch.topk(session_next_logits(session), 3).indices.tolist()
            if shape == 0:  # plain steps, some decoding ahead
                session.verify(step, len(session.committed), EMPTY, decode_ahead=1 + step % 3)
            elif shape == 1:  # a chain of the target's top token and a second root child
                result = session.verify(step, len(session.committed), DraftTree((top[0], top[1], top[0]), (ROOT, 0, ROOT)))
                accepted += len(result.accepted)
            else:  # wider trees, and once a resume that rolls two tokens back and resends them as provisional
                if step == 4:
                    confirmed = len(session.committed) - 2
                    session.resume(confirmed, committed_hash(session.committed[:confirmed]),
                                   session.committed[confirmed:], ResumePolicy.KEEP)
                tree = DraftTree((top[1], top[0], top[2], top[0]), (ROOT, ROOT, ROOT, 1))
                accepted += len(session.verify(step, len(session.committed), tree).accepted)
            step += 1
        texts.append(session.committed[len(prompt):len(prompt) + n])
        if shape:
            assert accepted > 0, shape
    assert texts[0] == texts[1] == texts[2] == plain
    other = [t.id for t in generate(target, scheduler, GenerationRequest(tuple(prompt), n, sampling, 6,
                                                                        stop_at_eos=False))]
    assert other != plain


def test_repeated_step_is_answered_from_the_record(target, scheduler):
    session = make_session(target, scheduler)
    session.open([1, 2, 3])
    tree = DraftTree((5, 6), (ROOT, 0))
    first = session.verify(1, 4, tree)
    again = session.verify(1, 4, tree)
    assert again is first and len(session.committed) == first.committed_len


def test_features_of_prompt_and_of_root_plus_accepted(target, scheduler, greedy_reference):
    lsa = LayerSelfAttention(LSAConfig(target.num_layers, target.kv_size)).to(target.device).eval()
    session = make_session(target, scheduler, features=FeatureRequest(FeatureKind.MOA, tli_layers=1), lsa=lsa)
    prompt = [10, 20, 30, 40]
    opened = session.open(prompt)
    frames = {name: decode_frame(frame) for name, frame in opened.features}
    e_kv = target.kv_size
    assert frames["lsa"].shape == (4, 2 * e_kv)
    assert frames["tli_k"].shape == (1, 4, e_kv) and frames["tli_v"].shape == (1, 4, e_kv)
    truth = greedy_reference(prompt, 3)
    result = session.verify(1, 5, DraftTree((truth[1], truth[2]), (ROOT, 0)))
    assert result.accepted == (0, 1)
    frames = {name: decode_frame(frame) for name, frame in result.features}
    assert frames["lsa"].shape == (3, 2 * e_kv)  # root + 2 accepted
    # tli_v of the last layer is the cached V of those tokens (codec error aside)
    e = target.kv_size
    cached_v = session.kv.layer_kv(4, 7)[:, -1, e:].float().cpu()  # [3, E_kv]: the last layer's V
    assert torch.allclose(frames["tli_v"][0], cached_v, atol=0.05 * cached_v.abs().max().item())


def test_hidden_features_equal_the_final_norm_output(target, scheduler):
    session = make_session(target, scheduler, features=FeatureRequest(FeatureKind.LAST_HIDDEN))
    prompt = [5, 6, 7, 8, 9]
    opened = session.open(prompt)
    (name, frame), = opened.features
    with torch.inference_mode():
        ids = torch.tensor([prompt], device=target.device)
        ref_logits = target.model(input_ids=ids).logits[0].cpu()
        head_in = target.model.get_decoder()(input_ids=ids).last_hidden_state[0]
        head_out = target.model.lm_head(head_in).cpu()
        head_in = head_in.cpu()
    assert name == "hidden"
    got = decode_frame(frame)
    assert got.shape == (5, target.hidden_size)
    assert torch.allclose(got, head_in, atol=0.05 * head_in.abs().max().item())
    # and the LM head on it gives the model's logits
    assert torch.allclose(head_out, ref_logits, atol=1e-4)


@pytest.mark.parametrize("policy", [ResumePolicy.KEEP, ResumePolicy.ROLLBACK])
def test_resume_verifies_provisional_tokens_as_a_chain(target, scheduler, greedy_reference, policy):
    prompt = [3, 1, 4, 1, 5]
    truth = greedy_reference(prompt, 12)
    session = make_session(target, scheduler)
    session.open(prompt)
    session.verify(1, 6, DraftTree.chain(truth[1:4]))  # committed: prompt + truth[:5]
    confirmed = prompt + truth[:2]  # the client only saw an older state
    provisional = truth[2:5] + [(truth[5] + 1) % 256, 7]
    result = session.resume(len(confirmed), committed_hash(confirmed), provisional, policy)
    assert result.agreed == 3
    if policy is ResumePolicy.ROLLBACK:
        assert session.committed == prompt + truth[:6]  # exactly the target's text
    else:
        assert session.committed[:len(confirmed) + 5] == confirmed + provisional
    assert result.committed_len == len(session.committed)
    assert torch.allclose(session_next_logits(session), fresh_next_logits(target, session.committed), atol=1e-4)


def test_rebuild_then_resume_equals_a_restored_session(target, scheduler, greedy_reference):
    prompt = [9, 8, 7]
    truth = greedy_reference(prompt, 6)
    confirmed = prompt + truth[:3]
    session = make_session(target, scheduler)
    session.rebuild(confirmed)
    result = session.resume(len(confirmed), committed_hash(confirmed), truth[3:5], ResumePolicy.ROLLBACK)
    assert result.agreed == 2 and result.next_token == truth[5]


# ------------------------------------------------------------------ decoding ahead (Draft.decode_ahead)
EMPTY = DraftTree((), ())


@pytest.mark.parametrize("sampling", [SamplingSettings(), SamplingSettings(temperature=1.0, top_k=20)],
                         ids=["greedy", "sampled"])
def test_decoding_ahead_commits_what_as_many_plain_steps_would(target, scheduler, sampling):
    """k tokens decoded ahead in one Draft are the k tokens k plain Drafts commit (the same draws, keyed by
    position), with the same cache, features and logprobs."""
    rng = random.Random(11)
    prompt = [rng.randrange(256) for _ in range(7)]
    features = FeatureRequest(FeatureKind.LAST_HIDDEN)
    ahead, plain = (VerifierSession(SessionSettings("test", sampling, 4, features, logprobs=2), target, scheduler,
                                    max_context_tokens=1024) for _ in range(2))
    for s in (ahead, plain):
        s.open(prompt)
    result = ahead.verify(1, len(ahead.committed), EMPTY, decode_ahead=6)
    singles = [plain.verify(step, len(plain.committed), EMPTY) for step in range(1, 7)]
    assert ahead.committed == plain.committed
    assert list(result.decoded) + [result.next_token] == ahead.committed[-6:]
    assert result.accepted == () and result.committed_len == len(ahead.committed)
    assert len(ahead.kv) == len(ahead.committed) - 1
    assert torch.allclose(session_next_logits(ahead), fresh_next_logits(target, ahead.committed), atol=1e-4)
    (_, frame), = result.features  # the root and the 5 decoded tokens, as a chain accepted whole would have
    # (each frame keeps its own outlier channels apart, so the two agree to the int8 step)
    assert torch.allclose(decode_frame(frame), torch.cat([decode_frame(s.features[0][1]) for s in singles]),
                          atol=0.05)
    assert [lp.logprob for lp in result.logprobs] == pytest.approx([s.logprobs[0].logprob for s in singles])


def test_decoding_ahead_stops_after_eos_and_at_the_context_limit(target, scheduler, greedy_reference, monkeypatch):
    prompt = [3, 1, 4, 1, 5]
    truth = greedy_reference(prompt, 12)
    eos = truth[4]  # the fifth token the target writes stands in for EOS
    monkeypatch.setattr(target, "eos_ids", frozenset({eos}))
    session = make_session(target, scheduler)
    session.open(prompt)
    result = session.verify(1, len(session.committed), EMPTY, decode_ahead=10)
    assert result.next_token == eos and session.committed[len(prompt):] == truth[:truth.index(eos) + 1]
    monkeypatch.undo()
    short = VerifierSession(SessionSettings("test"), target, scheduler, max_context_tokens=len(prompt) + 4)
    short.open(prompt)
    result = short.verify(1, len(short.committed), EMPTY, decode_ahead=10)
    assert len(short.committed) == short.max_context_tokens  # as many as there was room for
    assert short.committed[len(prompt):] == truth[:4]


def test_decoding_ahead_refuses_a_tree_and_too_many_tokens(target, scheduler):
    from edgespec.server.errors import InvalidRequestError
    from edgespec.shared.wire import MAX_DECODE_AHEAD

    session = make_session(target, scheduler)
    session.open([1, 2, 3])
    with pytest.raises(InvalidRequestError, match="decode_ahead=4 comes with a tree of 2 nodes"):
        session.verify(1, 4, DraftTree((5, 6), (ROOT, 0)), decode_ahead=4)
    with pytest.raises(InvalidRequestError, match=f"more than the {MAX_DECODE_AHEAD} tokens"):
        session.verify(1, 4, EMPTY, decode_ahead=MAX_DECODE_AHEAD + 1)
    assert session.committed == [1, 2, 3, session.committed[3]] and len(session.kv) == 3  # nothing lost


def test_a_queued_draft_behind_a_step_that_ended_short_is_skipped(target, scheduler, greedy_reference, monkeypatch):
    """Draft.queued: sent before the answer to the step before, it hangs from where that step was asked to leave
    the text. Behind a full step it is an ordinary Draft; behind one that ended short (EOS) it is skipped and
    changes nothing; a Draft that is not queued and hangs past the text is refused as before."""
    from edgespec.server.errors import StaleStateError

    prompt = [3, 1, 4, 1, 5]
    truth = greedy_reference(prompt, 12)
    session = make_session(target, scheduler)
    session.open(prompt)
    first = session.verify(1, len(session.committed), EMPTY, decode_ahead=3)
    queued = session.verify(2, len(prompt) + 1 + 3, EMPTY, decode_ahead=2, queued=True)  # behind a full step
    assert not first.skipped and not queued.skipped
    assert session.committed[len(prompt):] == truth[:6] and queued.committed_len == len(prompt) + 6
    eos = truth[7]  # the step after the next ends two tokens into four
    monkeypatch.setattr(target, "eos_ids", frozenset({eos}))
    short = session.verify(3, len(session.committed), EMPTY, decode_ahead=4)
    assert short.next_token == eos and len(short.decoded) == 1
    before, kv = list(session.committed), len(session.kv)
    skipped = session.verify(4, len(prompt) + 6 + 4, EMPTY, decode_ahead=4, queued=True)
    assert skipped.skipped and skipped.committed_len == len(before) and not skipped.decoded
    assert session.committed == before and len(session.kv) == kv  # nothing done
    with pytest.raises(StaleStateError, match="send Resume"):
        session.verify(5, len(prompt) + 6 + 4, EMPTY, decode_ahead=4)  # not queued: a client out of step
    again = session.verify(5, len(session.committed), EMPTY, decode_ahead=2, queued=True)  # the text's end: runs
    assert not again.skipped and session.committed[len(prompt):] == truth[:10]
