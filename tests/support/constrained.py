"""The target's own output under logits processors, step by step without speculation: the reference that
constrained and penalised speculative output must equal token for token.

Written apart from ``edgespec.shared.logits_processors`` on purpose (plain loops over the history, a fresh
llguidance matcher fed token by token), so a mistake there is not repeated here.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class Controls:
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)


def processed(logits: torch.Tensor, prompt: list[int], output: list[int], controls: Controls,
              allowed: torch.Tensor | None = None) -> torch.Tensor:
    """One row [V] processed as vLLM does, float64: bias, repetition over prompt + output, frequency and
    presence over the output, then the grammar's mask."""
    out = logits.double().clone()
    for token, bias in controls.logit_bias.items():
        out[token] += bias
    for token in set(prompt) | set(output):
        out[token] = out[token] / controls.repetition if out[token] > 0 else out[token] * controls.repetition
    for token, count in Counter(output).items():
        out[token] -= controls.frequency * count + controls.presence
    if allowed is not None:
        out[~allowed] = float("-inf")
    return out


def grammar_allowed(matcher, vocab_size: int) -> torch.Tensor:
    mask = np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8)[:vocab_size] > 0
    row = torch.zeros(vocab_size, dtype=torch.bool)
    row[:len(mask)] = torch.from_numpy(mask.copy())
    return row


@torch.inference_mode()
def constrained_greedy(model, prompt: list[int], n: int, controls: Controls = Controls(), matcher=None,
                       eos: frozenset[int] = frozenset()) -> list[int]:
    """Up to n tokens after prompt, each the argmax of a fresh full forward, processed; ends after an EOS."""
    output: list[int] = []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([prompt + output], device=model.device)).logits[0, -1].float().cpu()
        allowed = grammar_allowed(matcher, logits.shape[-1]) if matcher is not None else None
        token = int(processed(logits, prompt, output, controls, allowed).argmax())
        output.append(token)
        if matcher is not None:
            assert matcher.consume_token(token), matcher.get_error()
        if token in eos:
            break
    return output
