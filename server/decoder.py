"""The plain decoder behind the OpenAI-style API: the server generating alone.

This is the baseline the experiments compare speculative decoding against, so
it is an ordinary efficient decoder: one prefill (LM head on the last row
only), then one forward of one token per step on a KV cache. Each forward goes
through the shared ``ModelScheduler``, so API requests ride in the same batches
as verification sessions, on the same engine. With a ``PrefixCache`` the prefill
starts after the longest cached prefix of the prompt, and the generation's KV
(prompt and output) is kept there when it ends, for the conversation's next turn.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from edgespec.shared.grammar import GrammarConstraint, grammar_tokenizer
from edgespec.shared.logits_processors import RowProcessors
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.verification import Draws, next_token

from .prefix.cache import PrefixCache
from .scheduler import ModelScheduler
from .target import TargetModel

log = logging.getLogger("edgespec.server")


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]  # tokenized prompt (chat template already applied)
    max_new_tokens: int = 16  # most tokens to generate
    sampling: SamplingSettings = SamplingSettings()  # greedy unless temperature > 0; penalties, logit_bias
    seed: int | None = None  # None = a fresh random seed
    stop_at_eos: bool = True  # stop after the target's end-of-sequence token (yielded last: it was generated)
    grammar: str = ""  # llguidance grammar (shared.grammar) the output must follow; '' = none


@dataclass(frozen=True)
class DecodedToken:
    id: int  # the token generated
    logits: torch.Tensor  # [V] float32: the target's raw logits it was drawn from (for logprobs)
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (the same on every token)


def generate(target: TargetModel, scheduler: ModelScheduler, request: GenerationRequest,
             prefix_cache: PrefixCache | None = None) -> Iterator[DecodedToken]:
    """Yield generated tokens one by one."""
    draws = Draws(request.seed)  # each token drawn by its position: the same text as a session with this seed
    rows = processors(target, request.sampling, request.grammar, request.prompt_ids)
    history = list(request.prompt_ids)  # what the processors see: prompt + output so far
    kv = scheduler.new_kv()  # pool blocks on the batched engine: given back when the generation ends
    prompt = list(request.prompt_ids)
    held: list[int] = []  # the ids whose KV kv holds
    try:
        if prefix_cache is not None and request.max_new_tokens > 0:
            kv.reserve()
            held = prompt[:prefix_cache.restore(kv, prompt, len(prompt) - 1)]  # the last prompt token is fed:
            # its logits pick the first token
        cached = len(held)
        ids: Sequence[int] = prompt[cached:]
        for _ in range(request.max_new_tokens):
            token, logits = scheduler.run_job(
                decode_step(scheduler, kv, ids, request.sampling, draws, rows, history), kv)
            held += ids
            yield DecodedToken(token, logits, cached)
            if request.stop_at_eos and token in target.eos_ids:
                return
            ids = [token]
            history.append(token)
    finally:
        try:  # ended, stopped or left by its caller: the KV goes to the prefix cache (not after a failed step)
            if prefix_cache is not None and held and len(kv) == len(held):
                prefix_cache.store(kv, held)
        except Exception:  # noqa: BLE001 - the generation's tokens are out; only the cache entry is lost
            log.exception("keeping a plain-API generation's prefix failed")
        finally:
            kv.close()


def processors(target: TargetModel, sampling: SamplingSettings, grammar: str,
               prompt: Sequence[int]) -> RowProcessors | None:
    """A generation's logits processors (penalties, logit_bias, grammar), or None when it has none: then the
    target's logits are drawn from (or accepted on) untouched."""
    if not (sampling.processed or grammar):
        return None
    constraint = None
    if grammar:
        constraint = GrammarConstraint(grammar_tokenizer(target.tokenizer, target.vocab_size, target.eos_ids), grammar)
    return RowProcessors(sampling, prompt, target.vocab_size, constraint, eos_ids=sorted(target.eos_ids))


def decode_step(scheduler: ModelScheduler, kv, ids: Sequence[int], sampling: SamplingSettings, draws: Draws,
                rows: RowProcessors | None = None, history: Sequence[int] = ()):
    """One step as a scheduler job: the forward batched with every other session's work, the draw on the
    model thread too; (token, its raw logits [V])."""
    out = yield from scheduler.prefill(kv, ids)
    raw = out.logits[-1].clone()  # outlives the job: the forward's buffers are reused
    if rows is None and sampling.greedy and out.best:
        return out.best[-1], raw  # the argmax the engine read back with the batch
    logits = raw if rows is None else rows.next_logits(raw, history)
    return next_token(logits, sampling, draws, len(history)), raw
