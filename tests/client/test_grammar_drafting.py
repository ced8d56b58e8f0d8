"""Drafting inside a grammar: the client masks its drafter's candidates with the grammar the server verifies
with, so no tree node is spent on a token the target must refuse, and the output under a grammar and
penalties is token for token the target's own constrained greedy output (a real VerifierCore in this
process, no sockets)."""
from __future__ import annotations

import llguidance
import pytest
import torch
from support.constrained import Controls, constrained_greedy

from edgespec.client.drafters.factory import DrafterOptions, make_drafter
from edgespec.client.drafters.tree_builder import TreeShape, build_tree
from edgespec.client.link.in_process import InProcessTransport
from edgespec.client.link.verifier import Verifier
from edgespec.client.loop.generation import Generation, GenerationConfig, TokenizerInfo
from edgespec.shared.grammar import GrammarConstraint, grammar_tokenizer, json_schema_grammar
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.tree import DraftTree

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "note": {"type": "string", "maxLength": 8}}, "required": ["id", "tags", "note"], "additionalProperties": False}
CONTROLS = Controls(presence=0.4, frequency=0.2, repetition=1.2)


@pytest.fixture(scope="module")
def llg(core):
    t = core.target
    return grammar_tokenizer(t.tokenizer, t.vocab_size, t.eos_ids)


@pytest.mark.parametrize("drafter", ["ngram", "independent"])
def test_constrained_speculation_equals_the_constrained_reference(core, llg, tiny_drafter_dir, drafter, monkeypatch):
    from edgespec.server.rpc.service import VerifierServicer

    target, tok = core.target, core.target.tokenizer
    grammar = json_schema_grammar(SCHEMA)
    ids = tok("<|im_start|>user\nan item<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    truth = constrained_greedy(target.model, ids, 120, CONTROLS,
                               llguidance.LLMatcher(llg, grammar, log_level=0), target.eos_ids)
    assert truth[-1] in target.eos_ids
    trees: list[tuple[int, DraftTree]] = []
    send = Verifier.send_draft
    monkeypatch.setattr(Verifier, "send_draft", lambda self, step, n, tree, *more: trees.append((n, tree)) or
                        send(self, step, n, tree, *more))
    info = TokenizerInfo(target.fingerprint, set(target.eos_ids), lambda t: tok.decode(list(t)), lambda: llg)
    sampling = SamplingSettings(presence_penalty=CONTROLS.presence, frequency_penalty=CONTROLS.frequency,
                                repetition_penalty=CONTROLS.repetition)
    config = GenerationConfig(max_new_tokens=120, sampling=sampling, grammar=grammar)
    options = DrafterOptions(name=drafter, model=str(tiny_drafter_dir), dtype="float32")
    result = Generation(Verifier(InProcessTransport(VerifierServicer(core))), make_drafter(options), ids, config,
                        info).run()
    assert result.token_ids == truth
    # every tree sent lies inside the grammar: cutting it to the grammar changes nothing
    check = GrammarConstraint(llg, grammar)
    output = result.token_ids
    assert trees and sum(len(t) for _, t in trees) > 0
    for n, tree in trees:
        assert check.prune(output[:n - len(ids)], tree) == tree


def test_build_tree_drafts_only_what_the_grammar_allows(core, llg):
    """With random drafter distributions an unconstrained tree holds refused tokens; a constrained one none,
    also through a reduced draft vocabulary (candidate ids mapped to target ids)."""
    grammar = json_schema_grammar(SCHEMA)
    constraint = GrammarConstraint(llg, grammar)
    output = core.target.tokenizer('{"id": 1', add_special_tokens=False)["input_ids"]
    vocab = core.target.vocab_size
    gen = torch.Generator().manual_seed(0)
    shape = TreeShape(branch=3, depth=6, max_nodes=30, min_prob=0.0)
    to_target = list(range(vocab))[::-1]  # a draft vocabulary in another order

    def logprobs(k: int) -> torch.Tensor:
        return torch.log_softmax(torch.randn(k, vocab, generator=gen) * 3, -1)

    free, _ = build_tree(logprobs(1)[0], lambda f, c: logprobs(len(f)), shape)
    assert constraint.prune(output, free) != free
    tree, _ = build_tree(logprobs(1)[0], lambda f, c: logprobs(len(f)), shape, constraint=constraint.after(output))
    assert len(tree) > 5 and constraint.prune(output, tree) == tree
    mapped, _ = build_tree(logprobs(1)[0], lambda f, c: logprobs(len(f)), shape,
                           constraint=constraint.after(output), to_target=to_target)
    as_target = DraftTree(tuple(to_target[t] for t in mapped.tokens), mapped.parents)
    assert len(mapped) > 5 and constraint.prune(output, as_target) == as_target
