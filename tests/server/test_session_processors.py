"""VerifierSession under logits processors (penalties, logit_bias, a grammar) on the tiny target: verifying
random trees commits exactly what a plain decoder applying the same processors step by step commits.

Each tree node's row is processed from that node's own history, so a tree that follows the reference for a
while, with random siblings (tokens the grammar refuses among them), must commit the reference's tokens.
Both engines (a DynamicCache per session; a slot of the pre-allocated pool) are run.
"""
from __future__ import annotations

import json
import random

import llguidance
import pytest
import torch
from support.constrained import Controls, constrained_greedy
from support.trees import tree_along

from edgespec.server.errors import InvalidRequestError
from edgespec.server.session import VerifierSession
from edgespec.shared.wire import ResumePolicy
from edgespec.server.target import TargetModel
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.grammar import grammar_tokenizer, json_schema_grammar
from edgespec.shared.models.loading import load_model
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.session_settings import SessionSettings
from edgespec.shared.tree import ROOT, DraftTree


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "tags": {"type": "array", "items": {"enum": ["a", "bc", "def"]}, "maxItems": 4},
    "ok": {"type": "boolean"}}, "required": ["name", "tags", "ok"], "additionalProperties": False}
CONTROLS = Controls(presence=0.7, frequency=0.4, repetition=1.3, logit_bias={65: 4.0, 66: -100.0})


@pytest.fixture(scope="module")
def target(tiny_model_dir) -> TargetModel:
    return TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32"))


def sampling_of(c: Controls) -> SamplingSettings:
    return SamplingSettings(presence_penalty=c.presence, frequency_penalty=c.frequency, repetition_penalty=c.repetition,
                            logit_bias=tuple(c.logit_bias.items()))


def session_with(target, scheduler, controls: Controls = Controls(), grammar: str = "", prompt_len: int = 0):
    settings = SessionSettings("test", sampling_of(controls), grammar=grammar, prompt_len=prompt_len)
    return VerifierSession(settings, target, scheduler, max_context_tokens=1024)


def reference(target, prompt, n, controls=Controls(), grammar=None, stop_at_eos=True):
    matcher = None
    if grammar:
        matcher = llguidance.LLMatcher(grammar_tokenizer(target.tokenizer, target.vocab_size, target.eos_ids),
                                       grammar, log_level=0)
    return constrained_greedy(target.model, prompt, n, controls, matcher,
                              target.eos_ids if stop_at_eos else frozenset())


def run_trees(session, prompt, truth, rng, open_tree: bool) -> list[int]:
    """Open (with a tree or not), then verify trees until the reference is covered or ends; the output."""
    session.open(prompt, tree_along(rng, truth) if open_tree else None)
    step = 0
    while len(session.committed) - len(prompt) < len(truth) and session.committed[-1] not in session.target.eos_ids:
        done = len(session.committed) - len(prompt)
        step += 1
        session.verify(step, len(session.committed), tree_along(rng, truth[done:]))
    return session.committed[len(prompt):]


@pytest.mark.parametrize("seed", [0, 1])
def test_penalised_greedy_trees_commit_the_penalised_reference(target, scheduler, seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(256) for _ in range(rng.randint(3, 10))]
    truth = reference(target, prompt, 40, CONTROLS)
    unpenalised = reference(target, prompt, 40)
    assert truth != unpenalised  # the processors change the output, so the check below can fail
    out = run_trees(session_with(target, scheduler, CONTROLS), prompt, truth, rng, open_tree=seed % 2 == 0)
    assert out[:len(truth)] == truth


@pytest.mark.parametrize("seed", [0, 1])
def test_grammar_greedy_trees_commit_the_constrained_reference(target, scheduler, seed):
    rng = random.Random(10 + seed)
    prompt = [rng.randrange(256) for _ in range(rng.randint(3, 10))]
    grammar = json_schema_grammar(SCHEMA)
    truth = reference(target, prompt, 80, CONTROLS, grammar)
    assert truth[-1] in target.eos_ids  # the document was finished, then EOS was the only choice
    out = run_trees(session_with(target, scheduler, CONTROLS, grammar), prompt, truth, rng, open_tree=seed == 0)
    assert out[:len(truth)] == truth  # (a tree may run on past the EOS: the client ends the output there)
    doc = json.loads(target.tokenizer.decode(truth[:-1]))
    assert set(doc) == {"name", "tags", "ok"} and len(doc["name"]) <= 12


def test_resume_chain_under_processors_agrees_up_to_the_first_wrong_token(target, scheduler):
    rng = random.Random(7)
    prompt = [rng.randrange(256) for _ in range(6)]
    truth = reference(target, prompt, 20, CONTROLS, stop_at_eos=False)
    session = session_with(target, scheduler, CONTROLS, prompt_len=len(prompt))
    session.open(prompt)
    confirmed = prompt + truth[:1]
    provisional = truth[1:8] + [(truth[8] + 1) % 256] + truth[9:12]
    result = session.resume(len(confirmed), committed_hash(confirmed), provisional, ResumePolicy.ROLLBACK)
    assert result.agreed == 7
    assert session.committed[len(prompt):] == truth[:9]
    # a session rebuilt from the committed ids (it expired) goes on under the same processors
    rebuilt = session_with(target, scheduler, CONTROLS, prompt_len=len(prompt))
    rebuilt.rebuild(session.committed)
    rebuilt.verify(1, len(rebuilt.committed), DraftTree(tuple(truth[9:14]), (ROOT, 0, 1, 2, 3)))
    assert rebuilt.committed[len(prompt):] == truth[:15]


def test_a_bad_grammar_or_logit_bias_is_refused_at_open(target, scheduler):
    with pytest.raises(InvalidRequestError, match="grammar|Grammar|parse|expected"):
        session_with(target, scheduler, grammar="start: (").open([1, 2, 3])
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        session_with(target, scheduler, Controls(logit_bias={10 ** 6: 1.0})).open([1, 2, 3])


def test_no_processors_leave_the_logits_untouched(target, scheduler):
    session = session_with(target, scheduler)
    session.open([1, 2, 3])
    assert session.rows is None
    assert torch.equal(session._shaped(torch.ones(2, 4), [1], DraftTree((5,), (ROOT,))), torch.ones(2, 4))
