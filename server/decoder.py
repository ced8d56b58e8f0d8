"""The plain decoder behind the OpenAI-style API: the server generating alone.

This is the baseline the experiments compare speculative decoding against, so
it is an ordinary efficient decoder: one prefill (LM head on the last row
only), then one forward of one token per step on a KV cache. Each forward goes
through the shared ``ModelScheduler``, so API requests ride in the same batches
as verification sessions, on the same engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from edgespec.shared.grammar import GrammarConstraint, grammar_tokenizer
from edgespec.shared.logits_processors import Penalties, RowProcessors
from edgespec.shared.verification import SamplingConfig, next_token

from .scheduler import ModelScheduler
from .target import TargetModel


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]  # tokenized prompt (chat template already applied)
    max_new_tokens: int = 16  # most tokens to generate
    sampling: SamplingConfig = SamplingConfig()  # greedy unless temperature > 0
    seed: int | None = None  # None = a fresh random seed
    stop_at_eos: bool = True  # stop after the target's end-of-sequence token (yielded last: it was generated)
    penalties: Penalties = Penalties()  # presence/frequency/repetition penalties and logit_bias
    grammar: str = ""  # llguidance grammar (shared.grammar) the output must follow; '' = none


@dataclass(frozen=True)
class DecodedToken:
    id: int  # the token generated
    logits: torch.Tensor  # [V] float32: the target's raw logits it was drawn from (for logprobs)


def generate(target: TargetModel, scheduler: ModelScheduler, request: GenerationRequest) -> Iterator[DecodedToken]:
    """Yield generated tokens one by one."""
    generator = torch.Generator()
    if request.seed is None:
        generator.seed()
    else:
        generator.manual_seed(request.seed)
    rows = processors(target, request)
    history = list(request.prompt_ids)  # what the processors see: prompt + output so far
    kv = scheduler.new_kv()  # a pool slot on the batched engine: given back when the generation ends
    ids: Sequence[int] = request.prompt_ids
    try:
        for _ in range(request.max_new_tokens):
            token, logits = scheduler.run_job(_step(scheduler, kv, ids, request.sampling, generator, rows, history),
                                              kv)
            yield DecodedToken(token, logits)
            if request.stop_at_eos and token in target.eos_ids:
                return
            ids = [token]
            history.append(token)
    finally:
        kv.close()


def processors(target: TargetModel, request: GenerationRequest) -> RowProcessors | None:
    """The request's logits processors (penalties, logit_bias, grammar), or None when it has none."""
    if not (request.penalties.active or request.grammar):
        return None
    constraint = None
    if request.grammar:
        constraint = GrammarConstraint(grammar_tokenizer(target.tokenizer, target.vocab_size, target.eos_ids),
                                       request.grammar)
    return RowProcessors(request.penalties, request.prompt_ids, target.vocab_size, constraint)


def _step(scheduler: ModelScheduler, kv, ids: Sequence[int], sampling: SamplingConfig, generator: torch.Generator,
          rows: RowProcessors | None = None, history: Sequence[int] = ()):
    """One step as a scheduler job: the forward batched with every other session's work, the draw on the
    model thread too; (token, its raw logits [V])."""
    out = yield from scheduler.prefill(kv, ids)
    logits = out.logits[-1] if rows is None else rows.next_logits(out.logits[-1], history)
    return next_token(logits, sampling, generator), out.logits[-1]
