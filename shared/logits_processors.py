"""History-dependent logits processors (vLLM's penalties and logit_bias), applied per row of a tree.

Their meanings and order are vLLM's, as a session's ``SamplingSettings`` (``shared.session_contract``)
states them. "Output" is what was generated after the prompt; the prompt counts for the repetition penalty
only.

Under speculation the target verifies a tree, and each row is the target's distribution after a
different history: row 0 (the root) after the committed tokens, row 1 + i after the committed tokens
and node i's path (its ancestors and itself). ``tree_histories`` gives each row's output counts, so the
processors see at every node exactly what a plain decoder would have seen had it generated that path:
what the target would have chosen there is what it chooses here, and the output stays the target's.
The grammar constraint (``shared.grammar``) is the other per-row processor; ``RowProcessors`` runs both.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.tree import DraftTree


def apply_penalties(logits: torch.Tensor, sampling: SamplingSettings, prompt_seen: torch.Tensor,
                    output_counts: torch.Tensor) -> torch.Tensor:
    """Processed copy of logits [R, V] (float32); prompt_seen [V] bool; output_counts [R, V] (one history a row)."""
    out = logits.float().clone()
    if sampling.logit_bias:
        ids = torch.tensor([t for t, _ in sampling.logit_bias], device=out.device)
        out[:, ids] += torch.tensor([b for _, b in sampling.logit_bias], device=out.device)
    counts = output_counts.to(out.device, torch.float32)
    if sampling.repetition_penalty != 1.0:
        seen = prompt_seen.to(out.device).unsqueeze(0) | (counts > 0)  # [R, V]
        scaled = torch.where(out > 0, out / sampling.repetition_penalty, out * sampling.repetition_penalty)
        out = torch.where(seen, scaled, out)
    if sampling.frequency_penalty:
        out -= sampling.frequency_penalty * counts
    if sampling.presence_penalty:
        out -= sampling.presence_penalty * (counts > 0).float()
    return out


def min_tokens_mask(logits: torch.Tensor, min_tokens: int, output_len: int, tree: DraftTree,
                    held_back: Sequence[int]) -> torch.Tensor:
    """vLLM's min_tokens per row of [root] + nodes: a row whose output (the committed output and the row's path)
    is still shorter than min_tokens cannot end it, so `held_back` (EOS and the stop ids) is -inf there."""
    lengths = [output_len] + [output_len + len(tree.ancestors(i)) for i in range(len(tree))]
    short = torch.tensor([n < min_tokens for n in lengths], device=logits.device)
    if not bool(short.any()):
        return logits
    out = logits.float().clone()
    ids = torch.tensor(list(held_back), dtype=torch.long, device=logits.device)
    rows = short.nonzero().squeeze(1)
    out[rows.unsqueeze(1), ids.unsqueeze(0)] = float("-inf")
    return out


def token_counts(tokens: Sequence[int], vocab_size: int) -> torch.Tensor:
    """How often each id occurs in tokens: [V] float32."""
    return torch.bincount(torch.tensor(list(tokens), dtype=torch.long), minlength=vocab_size)[:vocab_size].float()


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

    def __init__(self, sampling: SamplingSettings, prompt: Sequence[int], vocab_size: int,
                 constraint: RowConstraint | None = None, eos_ids: Sequence[int] = ()):
        self.sampling = sampling
        # min_tokens masks the target's EOS ids and the request's stop ids while a row's output is shorter
        self.held_back = sorted({*eos_ids, *sampling.stop_token_ids} if sampling.min_tokens else ())
        self.prompt_len = len(prompt)
        self.vocab_size = vocab_size
        self.constraint = constraint
        self.prompt_seen = token_counts(prompt, vocab_size) > 0  # [V]

    def tree_logits(self, logits: torch.Tensor, committed: Sequence[int], tree: DraftTree) -> torch.Tensor:
        """logits [1 + N, V] of [root] + nodes hung after `committed` (prompt included), processed per row."""
        output = committed[self.prompt_len:]
        out = logits
        if self.sampling.penalized:
            histories = tree_histories(token_counts(output, self.vocab_size), tree)
            out = apply_penalties(out, self.sampling, self.prompt_seen, histories)
        if self.constraint is not None:
            allowed = self.constraint.tree_masks(output, tree, logits.shape[-1]).to(out.device)
            out = out.float().masked_fill(~allowed, float("-inf"))
        if self.held_back:
            out = min_tokens_mask(out, self.sampling.min_tokens, len(output), tree, self.held_back)
        return out

    def next_logits(self, logits: torch.Tensor, committed: Sequence[int]) -> torch.Tensor:
        """One row [V] after `committed`, processed."""
        return self.tree_logits(logits.unsqueeze(0), committed, DraftTree((), ()))[0]
