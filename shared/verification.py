"""Verification maths: which draft nodes the target accepts, and the token after them.

Words (as in vLLM's rejection sampler):
- accepted tokens: draft tree nodes the target agrees with, a root-to-node path.
- recovered token: under sampling, when every child of the last accepted node is
  rejected, the token drawn from what is left of the target's distribution there.
- bonus token: the target's own token after the last accepted node when that
  node has no child left to try (greedy: its argmax; sampling: a draw from its
  distribution). On the wire the recovered and the bonus token travel in one
  field (``Verified.bonus_token``): either way it is the target's next token.
- acceptance length: tokens committed by one verification, the bonus (or
  recovered) token included, so it is ``len(accepted) + 1`` and at least 1.

Rows of ``logits`` / ``probs`` follow ``shared.tree``: row 0 is the root (the
last committed token), row 1 + i is node i. Row r holds the target's
distribution for the token *after* that row's token.

Greedy: a child is accepted when it equals the argmax at its parent; the output
is token for token the target's own greedy output.

Sampling (DESIGN section 4, lossless multi-draft): draft tokens are
deterministic picks, so at a node the children are tried in order: child x is
accepted with probability p(x); on rejection p(x) is set to 0 and p
renormalised before the next child; when all are rejected the recovered token is
drawn from the residual. By induction over the children the committed token is
distributed exactly as p.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.tree import DraftTree


@dataclass(frozen=True)
class VerifyOutcome:
    """Result of verifying one tree."""

    accepted: tuple[int, ...]  # node indices, root to leaf
    next_token: int  # bonus or recovered token: the target's token after the last accepted node
    recovered: bool = False  # True when next_token was drawn from a residual after rejections

    @property
    def acceptance_length(self) -> int:
        return len(self.accepted) + 1


def target_probs(logits: torch.Tensor, config: SamplingSettings) -> torch.Tensor:
    """Shape logits [..., V] into probabilities [..., V] (float64) by temperature, min-p, top-k, top-p
    (vLLM's order).

    Greedy configs give a one-hot on the argmax, so one code path serves both.
    """
    logits = logits.double()
    if config.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    logits = logits / config.temperature
    if config.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        floor = config.min_p * probs.amax(-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if 0 < config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0 < config.top_p < 1:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # Keep a token when the mass before it is below top_p: the smallest set reaching top_p.
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        keep_sorted = before < config.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_token(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One draw from probs [V] (drawn on the CPU, where generators live)."""
    return int(torch.multinomial(probs.to("cpu", torch.float64), 1, generator=generator).item())


def greedy_verify(tree: DraftTree, logits: torch.Tensor) -> VerifyOutcome:
    """Walk from the root accepting the child equal to the argmax at its parent. logits: [1 + N, V]."""
    return greedy_walk(tree, logits.argmax(-1).tolist())


def greedy_walk(tree: DraftTree, best: Sequence[int]) -> VerifyOutcome:
    """Walk from the root accepting the child equal to its parent's best token; best: [1 + N] for [root] + nodes."""
    children = tree.children()
    accepted: list[int] = []
    row = 0
    while True:
        match = next((c for c in children[row] if tree.tokens[c] == best[row]), None)
        if match is None:
            return VerifyOutcome(tuple(accepted), best[row])
        accepted.append(match)
        row = match + 1


def sample_verify(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None = None) -> VerifyOutcome:
    """Lossless multi-draft verification: children tried in order, residual renormalisation.

    probs: [1 + N, V] target distributions (from ``target_probs``) for [root] + nodes.
    """
    children = tree.children()
    accepted: list[int] = []
    row = 0
    while True:
        # [V] on the CPU, where the session's generator lives: the residual as children are rejected
        p = probs[row].to("cpu", torch.float64, copy=True)
        for child in children[row]:
            token = tree.tokens[child]
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u * float(p.sum()) < float(p[token]):  # accept with probability p(x) / sum(p)
                accepted.append(child)
                row = child + 1
                break
            p[token] = 0.0
        else:
            if float(p.sum()) <= 0:  # only through float rounding; the unshaped row is faithful
                p = probs[row].to("cpu", torch.float64)
            return VerifyOutcome(tuple(accepted), sample_token(p / p.sum(), generator), bool(children[row]))


def verify_tree(tree: DraftTree, logits: torch.Tensor, config: SamplingSettings,
                generator: torch.Generator | None = None) -> VerifyOutcome:
    """Greedy or sampling verification of a tree, as the config says. logits: [1 + N, V]."""
    if config.greedy:
        return greedy_verify(tree, logits)
    return sample_verify(tree, target_probs(logits, config), generator)


def next_token(logits: torch.Tensor, config: SamplingSettings, generator: torch.Generator | None = None) -> int:
    """The target's next token from one row of logits [V]: argmax, or a draw under the config."""
    if config.greedy:
        return int(logits.argmax(-1).item())
    return sample_token(target_probs(logits, config), generator)
