"""The plain decoder behind the OpenAI-style API: the server generating alone.

This is the baseline the experiments compare speculative decoding against, so
it is an ordinary efficient decoder: one prefill (LM head on the last row
only), then one forward of one token per step on a KV cache. Each forward is a
job on the shared ``ModelScheduler``, so API requests and verification sessions
take turns on the weights.
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
    stop_at_eos: bool = True  # stop after the target's end-of-sequence token (which is not yielded)


def generate(target: TargetModel, scheduler: ModelScheduler, request: GenerationRequest) -> Iterator[int]:
    """Yield generated token ids one by one."""
    generator = torch.Generator()
    if request.seed is None:
        generator.seed()
    else:
        generator.manual_seed(request.seed)
    cache = target.new_cache()
    ids: Sequence[int] = request.prompt_ids
    for _ in range(request.max_new_tokens):
        out, _ = scheduler.run(target.prefill, cache, ids)
        token = next_token(out.logits[-1], request.sampling, generator)
        if request.stop_at_eos and token in target.eos_ids:
            return
        yield token
        ids = [token]
