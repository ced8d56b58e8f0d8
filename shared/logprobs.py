"""The target's log-probabilities of the tokens it commits, for OpenAI's ``logprobs``.

Both APIs report the same numbers: the log-softmax of the target's raw logits
at the token's position, before temperature, top-k and top-p (vLLM's default,
``raw_logprobs``), and the ``top`` most likely tokens there. The server's plain
decoder takes them from the row it drew the token from; a verification takes
them from the rows it already computed for the tree, so asking for them costs
no forward pass (Verified/Opened/Resumed carry one entry per committed token).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One committed token's log-probability under the target, and the most likely tokens at its position."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, log-probability), most likely first


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int) -> tuple[TokenLogprob, ...]:
    """logits [R, V]: row i is the distribution token i was committed from; top: alternatives per token."""
    if logits.shape[0] != len(tokens):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(tokens)} tokens")
    if not tokens:
        return ()
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [R, V]
    chosen = logprobs.gather(-1, torch.tensor(list(tokens), device=logits.device)[:, None])[:, 0].tolist()
    if top <= 0:
        return tuple(TokenLogprob(lp) for lp in chosen)
    values, ids = torch.topk(logprobs, min(top, logprobs.shape[-1]), dim=-1)  # [R, top]
    return tuple(TokenLogprob(lp, tuple(zip(i, v))) for lp, i, v in zip(chosen, ids.tolist(), values.tolist()))
