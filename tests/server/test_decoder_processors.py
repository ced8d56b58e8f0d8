"""The plain decoder (the server's OpenAI API, the baseline) under logits processors and a grammar: its output
is the step-by-step reference's (tests/support/constrained.py), and ignore_eos runs past EOS."""
from __future__ import annotations

import llguidance
import pytest
from support.constrained import Controls, constrained_greedy

from edgespec.server.decoder import GenerationRequest, generate
from edgespec.server.engine.generic import GenericEngine
from edgespec.server.scheduler import ModelScheduler
from edgespec.shared.grammar import grammar_tokenizer, tool_call_grammar
from edgespec.shared.session_contract import SamplingSettings

FUNCTIONS = [{"name": "lookup", "parameters": {"type": "object", "properties": {"key": {"enum": ["a", "b"]}},
                                               "required": ["key"], "additionalProperties": False}}]


@pytest.fixture(scope="module")
def scheduler(tiny_target):
    s = ModelScheduler(GenericEngine(tiny_target))
    yield s
    s.close()


def test_plain_decoding_under_penalties_and_a_tool_grammar_is_the_reference(tiny_target, scheduler):
    t = tiny_target
    prompt = t.tokenizer("call a tool", add_special_tokens=False)["input_ids"]
    controls = Controls(presence=0.5, frequency=0.5, repetition=1.3, logit_bias={70: 2.0})
    grammar = tool_call_grammar(FUNCTIONS, parallel=False)
    matcher = llguidance.LLMatcher(grammar_tokenizer(t.tokenizer, t.vocab_size, t.eos_ids), grammar, log_level=0)
    truth = constrained_greedy(t.model, prompt, 80, controls, matcher, t.eos_ids)
    sampling = SamplingSettings(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.3,
                                logit_bias=((70, 2.0),))
    request = GenerationRequest(tuple(prompt), 80, sampling, grammar=grammar)
    out = [step.id for step in generate(t, scheduler, request)]
    assert out == truth and out[-1] in t.eos_ids
    assert t.tokenizer.decode(out[:-1]).startswith('<tool_call>\n{"name": "lookup", "arguments": {"key": ')


def test_ignore_eos_goes_past_eos(tiny_target, scheduler):
    t = tiny_target
    prompt = t.tokenizer("cx", add_special_tokens=False)["input_ids"]  # its greedy output ends after 16 tokens
    stopped = [s.id for s in generate(t, scheduler, GenerationRequest(tuple(prompt), 24))]
    assert len(stopped) < 24 and stopped[-1] in t.eos_ids
    going = [s.id for s in generate(t, scheduler, GenerationRequest(tuple(prompt), 24, stop_at_eos=False))]
    assert len(going) == 24 and going[:len(stopped)] == stopped
