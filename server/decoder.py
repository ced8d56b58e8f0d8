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
    kv = scheduler.new_kv()  # a pool slot on the batched engine: given back when the generation ends
    ids: Sequence[int] = request.prompt_ids
    try:
        for _ in range(request.max_new_tokens):
            token, logits = scheduler.run_job(_step(scheduler, kv, ids, request.sampling, generator), kv)
            yield DecodedToken(token, logits)
            if request.stop_at_eos and token in target.eos_ids:
                return
            ids = [token]
    finally:
        kv.close()


def _step(scheduler: ModelScheduler, kv, ids: Sequence[int], sampling: SamplingConfig, generator: torch.Generator):
    """One step as a scheduler job: the forward batched with every other session's work, the draw on the
    model thread too; (token, its logits [V])."""
    out = yield from scheduler.prefill(kv, ids)
    logits = out.logits[-1].clone()  # outlives the job: the forward's buffers are reused
    if sampling.greedy and out.best:
        return out.best[-1], logits  # the argmax the engine read back with the batch
    return next_token(logits, sampling, generator), logits
