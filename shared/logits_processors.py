"""History-dependent logits processors (vLLM's penalties and logit_bias), applied per row of a tree.

vLLM's meanings, in vLLM's order (before temperature, min_p, top-k and top-p):
- ``logit_bias``: a fixed value added to a token's logit (OpenAI's, clamped to [-100, 100]).
- ``repetition_penalty`` (> 0; 1 = off): a token seen in the prompt or the output so far has a
  positive logit divided by it and a negative one multiplied by it.
- ``frequency_penalty`` ([-2, 2]): minus penalty x how often the token is in the output so far.
- ``presence_penalty`` ([-2, 2]): minus penalty once the token is in the output at all.
"Output" is what was generated after the prompt; the prompt counts for the repetition penalty only.

Under speculation the target verifies a tree, and each row is the target's distribution after a
different history: row 0 (the root) after the committed tokens, row 1 + i after the committed tokens
and node i's path (its ancestors and itself). ``tree_histories`` gives each row's output counts, so the
processors see at every node exactly what a plain decoder would have seen had it generated that path:
what the target would have chosen there is what it chooses here, and the output stays the target's.
The grammar constraint (``shared.grammar``) is the other per-row processor; ``RowProcessors`` runs both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import torch

from edgespec.shared.tree import DraftTree

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's and vLLM's clamp
PENALTY_LIMIT = 2.0  # presence and frequency penalties lie in [-2, 2]


@dataclass(frozen=True)
class Penalties:
    """The history-dependent processors of one session; the defaults change nothing."""

    presence: float = 0.0  # presence_penalty in [-2, 2]
    frequency: float = 0.0  # frequency_penalty in [-2, 2]
    repetition: float = 1.0  # repetition_penalty > 0; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), bias clamped to [-100, 100]

    def __post_init__(self) -> None:
        for name, value in (("presence_penalty", self.presence), ("frequency_penalty", self.frequency)):
            if not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not self.repetition > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition}")
        bias = tuple(sorted((int(t), max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(b))))
                            for t, b in self.logit_bias))
        if any(t < 0 for t, _ in bias):
            raise ValueError("logit_bias token ids must be >= 0")
        object.__setattr__(self, "logit_bias", bias)

    @classmethod
    def of(cls, presence: float = 0.0, frequency: float = 0.0, repetition: float = 1.0,
           logit_bias: Mapping[int, float] | None = None) -> "Penalties":
        return cls(presence, frequency, repetition, tuple((logit_bias or {}).items()))

    @property
    def active(self) -> bool:
        return bool(self.presence or self.frequency or self.repetition != 1.0 or self.logit_bias)

    def check_vocab(self, vocab_size: int) -> None:
        bad = next((t for t, _ in self.logit_bias if t >= vocab_size), None)
        if bad is not None:
            raise ValueError(f"logit_bias names token id {bad}, outside the vocabulary [0, {vocab_size})")


def apply_penalties(logits: torch.Tensor, penalties: Penalties, prompt_seen: torch.Tensor,
                    output_counts: torch.Tensor) -> torch.Tensor:
    """Processed copy of logits [R, V] (float32); prompt_seen [V] bool; output_counts [R, V] (one history a row)."""
    out = logits.float().clone()
    if penalties.logit_bias:
        ids = torch.tensor([t for t, _ in penalties.logit_bias], device=out.device)
        out[:, ids] += torch.tensor([b for _, b in penalties.logit_bias], device=out.device)
    counts = output_counts.to(out.device, torch.float32)
    if penalties.repetition != 1.0:
        seen = prompt_seen.to(out.device).unsqueeze(0) | (counts > 0)  # [R, V]
        scaled = torch.where(out > 0, out / penalties.repetition, out * penalties.repetition)
        out = torch.where(seen, scaled, out)
    if penalties.frequency:
        out -= penalties.frequency * counts
    if penalties.presence:
        out -= penalties.presence * (counts > 0).float()
    return out


def token_counts(tokens: Sequence[int], vocab_size: int) -> torch.Tensor:
    """How often each id occurs in tokens: [V] float32."""
    counts = torch.zeros(vocab_size)
    if tokens:
        counts += torch.bincount(torch.tensor(list(tokens), dtype=torch.long), minlength=vocab_size)[:vocab_size]
    return counts


def tree_histories(base: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """Output counts per row of [root] + nodes: [1 + N, V]; row 0 is `base` [V], row 1 + i adds node i's path."""
    rows = base.unsqueeze(0).repeat(1 + len(tree), 1)
    for i in range(len(tree)):
        path = torch.tensor([tree.tokens[a] for a in tree.ancestors(i)], dtype=torch.long)
        rows[1 + i].index_add_(0, path, torch.ones(len(path)))  # a token may recur along a path: each counts
    return rows


class RowConstraint(Protocol):
    """A per-row constraint that depends on the path (the grammar): which tokens may come next."""

    def tree_masks(self, output: Sequence[int], tree: DraftTree, vocab_size: int) -> torch.Tensor:
        """Allowed tokens [1 + N, V] bool for [root] + nodes, after `output` (the committed output ids)."""


class RowProcessors:
    """Penalties, logit_bias and a constraint for one generation, applied per row from that row's history.

    Stateless for the caller: each call gets the committed ids, so a rollback (Resume), a rebuilt session
    or a retracted offline token needs no bookkeeping here; the constraint keeps its own cache."""

    def __init__(self, penalties: Penalties, prompt: Sequence[int], vocab_size: int,
                 constraint: RowConstraint | None = None):
        self.penalties = penalties
        self.prompt_len = len(prompt)
        self.vocab_size = vocab_size
        self.constraint = constraint
        self.prompt_seen = token_counts(prompt, vocab_size) > 0  # [V]

    @property
    def active(self) -> bool:
        return self.penalties.active or self.constraint is not None

    def tree_logits(self, logits: torch.Tensor, committed: Sequence[int], tree: DraftTree) -> torch.Tensor:
        """logits [1 + N, V] of [root] + nodes hung after `committed` (prompt included), processed per row."""
        output = committed[self.prompt_len:]
        out = logits
        if self.penalties.active:
            histories = tree_histories(token_counts(output, self.vocab_size), tree)
            out = apply_penalties(out, self.penalties, self.prompt_seen, histories)
        if self.constraint is not None:
            allowed = self.constraint.tree_masks(output, tree, logits.shape[-1]).to(out.device)
            out = out.float().masked_fill(~allowed, float("-inf"))
        return out

    def next_logits(self, logits: torch.Tensor, committed: Sequence[int]) -> torch.Tensor:
        """One row [V] after `committed`, processed."""
        return self.tree_logits(logits.unsqueeze(0), committed, DraftTree((), ()))[0]
