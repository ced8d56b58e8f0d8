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

Sampling (lossless multi-draft; shared/README.md): draft tokens are
deterministic picks, so at a node the target's token y is drawn from p there and
the child carrying y, if any, is accepted; otherwise y is the recovered token.
Each child x is then accepted with probability p(x), as when children are tried
in order with the residual renormalised after each rejection (SpecInfer's rule
for deterministic drafts), and the committed token is distributed exactly as p.
The draw for the token at sequence position i uses a uniform number keyed by
(seed, i) (``Draws``), not the next number of a stream: it does not depend on
how many draws came before, so a seed gives the same text whatever trees, plain
steps or resumes carried it, and the same text as the plain API with that seed.
"""
from __future__ import annotations

import random
import secrets
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


class Draws:
    """The uniform numbers of one seeded generation, keyed by the position of the token each draws."""

    def __init__(self, seed: int | None = None):
        self.seed = secrets.randbits(64) if seed is None else seed  # None: a fresh seed

    def uniform(self, position: int) -> float:
        """The number in [0, 1) that draws the token at sequence position ``position`` (0 = the first prompt
        token)."""
        return random.Random(f"{self.seed}/{position}").random()


def sample_token(probs: torch.Tensor, u: float) -> int:
    """The token at which the cumulative distribution of probs [V] first passes u (of its total): a draw from
    probs for a uniform u. On the CPU in float64, so every device and engine picks the same token."""
    p = probs.to("cpu", torch.float64)  # the one read from the device
    cdf = p.cumsum(0)
    token = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True))
    if token >= len(cdf) or p[token] <= 0:  # u * total rounded up to the total: the last kept token
        token = int(torch.nonzero(p > 0)[-1])
    return token


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


def sample_verify(tree: DraftTree, probs: torch.Tensor, draws: Draws, position: int) -> VerifyOutcome:
    """Lossless multi-draft verification: at each accepted row the target's token is drawn, and the child
    carrying it is accepted.

    probs: [1 + N, V] target distributions (from ``target_probs``) for [root] + nodes; position: the sequence
    position of the token the root row draws (the number of tokens before it).
    """
    children = tree.children()
    accepted: list[int] = []
    row = 0
    while True:
        drawn = sample_token(probs[row], draws.uniform(position + len(accepted)))
        match = next((c for c in children[row] if tree.tokens[c] == drawn), None)
        if match is None:
            return VerifyOutcome(tuple(accepted), drawn, bool(children[row]))
        accepted.append(match)
        row = match + 1


def verify_tree(tree: DraftTree, logits: torch.Tensor, config: SamplingSettings, draws: Draws,
                position: int) -> VerifyOutcome:
    """Greedy or sampling verification of a tree, as the config says. logits: [1 + N, V]; position: as for
    ``sample_verify``."""
    if config.greedy:
        return greedy_verify(tree, logits)
    return sample_verify(tree, target_probs(logits, config), draws, position)


def next_token(logits: torch.Tensor, config: SamplingSettings, draws: Draws, position: int) -> int:
    """The target's token at sequence position ``position`` from one row of logits [V]: argmax, or a draw
    under the config."""
    if config.greedy:
        return int(logits.argmax(-1).item())
    return sample_token(target_probs(logits, config), draws.uniform(position))
