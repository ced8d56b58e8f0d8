"""Building blocks of the learned drafters: our own small attention layers.

Every attention here takes explicit positions and an explicit boolean mask over
[past keys ; keys of this call], so one forward serves teacher-forced training
(causal mask), unrolled training (past = earlier steps) and drafting (past = the
drafter's cache, mask = tree visibility).

The masks live beside the layers that read them, as pure functions (the first part of this module), shared by
every learned drafter and its training recipe. Boolean masks: True = the query may attend to the key.
``additive`` turns one into the float form attention takes (0 / -inf). Shapes are [queries, keys].

Positions in training: a sequence of n tokens c_0..c_{n-1}. Target features lag
one token (proto/README.md, one step end to end): when c_0..c_{n-1} are committed, features exist
for c_0..c_{n-2}. A query at position i "is drafting" with the features up to
its *bound* b(i) visible, b(i) <= i - 1; ``bounds`` are the per-query b(i)
(-1 = no feature visible yet).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


# -- masks: pure functions ---------------------------------------------------------------------
def additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask -> additive float mask (0 where allowed, -inf where not)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))


def causal_mask(n: int, device=None) -> torch.Tensor:
    """[n, n]: query i sees keys j <= i."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def step_bounds(n: int, T: int, offset: int = 0, device=None) -> torch.Tensor:
    """[n] MoA's T-step bound: the sequence is cut into segments of T tokens starting at
    ``offset``; every query in a segment sees features only before the segment start.

    So the first query of a segment is one token past the last verified feature (the
    root of a draft) and the last is T tokens past it: the drafter learns to predict up to
    T tokens beyond what the server has verified. Queries before ``offset`` see nothing.
    """
    if T < 1:
        raise ValueError(f"the step bound T must be >= 1, got {T}")
    i = torch.arange(n, device=device)
    start = offset + torch.div(i - offset, T, rounding_mode="floor") * T
    return torch.where(i < offset, torch.full_like(i, -1), start - 1)


def bounded_mask(bounds: torch.Tensor, n_keys: int) -> torch.Tensor:
    """[len(bounds), n_keys]: query i sees keys j <= bounds[i] (the Cross-Attention memory)."""
    j = torch.arange(n_keys, device=bounds.device)
    return j[None, :] <= bounds[:, None]


def mixed_kv_mask(bounds: torch.Tensor) -> torch.Tensor:
    """[n, 2n] for keys [target's own K/V of positions 0..n-1 ; drafter-computed K/V of 0..n-1].

    TLI layers at query i use the target's K/V (sent by the server) up to its bound and
    their own K/V, computed from predicted activations, for positions bound+1..i: what the
    client holds while drafting.
    """
    n = bounds.shape[0]
    true_part = bounded_mask(bounds, n)
    j = torch.arange(n, device=bounds.device)
    i = j[:, None]
    own_part = (j[None, :] > bounds[:, None]) & (j[None, :] <= i)
    return torch.cat([true_part, own_part], dim=1)


def unrolled_mask(n: int, step: int, device=None) -> torch.Tensor:
    """[n, n * step] mask for step ``step`` (>= 2) of unrolled drafting (training-time test).

    Keys are [teacher-forced rows 0..n-1 ; rows of unrolled steps 2..step, n each]. The
    query of start t at this step sees teacher-forced rows j <= t and, for every earlier
    unrolled step, only the row of the same start t (its own draft chain), itself included.
    """
    if step < 2:
        raise ValueError(f"unrolled steps start at 2, got {step}")
    eye = torch.eye(n, dtype=torch.bool, device=device)
    return torch.cat([causal_mask(n, device)] + [eye] * (step - 1), dim=1)


# -- layers ------------------------------------------------------------------------------------
def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (rotate-half form). x: [H, T, D], positions: [T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # [T, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


@dataclass
class KV:
    """Keys and values of some rows: [H, T, D] each (after RoPE)."""

    k: torch.Tensor
    v: torch.Tensor

    def cat(self, other: "KV") -> "KV":
        return KV(torch.cat([self.k, other.k], 1), torch.cat([self.v, other.v], 1))

    def take(self, index: torch.Tensor | slice) -> "KV":
        return KV(self.k[:, index], self.v[:, index])


class Attention(nn.Module):
    """Multi-head attention with RoPE. ``forward`` is self-attention over [past ; x];
    ``attend`` takes keys made elsewhere (``project_kv`` of another source: cross-attention)."""

    def __init__(self, width: int, heads: int, source_width: int | None = None, rope_theta: float = 10000.0):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads, self.head_dim, self.rope_theta = heads, width // heads, rope_theta
        src = source_width or width
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(src, width, bias=False)
        self.v = nn.Linear(src, width, bias=False)
        self.o = nn.Linear(width, width, bias=False)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        # [T, W] -> [H, T, D]
        return x.view(x.shape[0], self.heads, self.head_dim).transpose(0, 1)

    def project_kv(self, source: torch.Tensor, positions: torch.Tensor) -> KV:
        return KV(rope(self.split(self.k(source)), positions, self.rope_theta), self.split(self.v(source)))

    def attend(self, x: torch.Tensor, positions: torch.Tensor, keys: KV, mask: torch.Tensor) -> torch.Tensor:
        # x: [T, W] queries; keys: K/V [H, S, D]; mask: bool [T, S]
        q = rope(self.split(self.q(x)), positions, self.rope_theta)
        out = F.scaled_dot_product_attention(q, keys.k, keys.v, attn_mask=additive(mask, q.dtype))
        return self.o(out.transpose(0, 1).reshape(x.shape[0], -1))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past: KV | None = None
                ) -> tuple[torch.Tensor, KV]:
        """Self-attention. x: [T, W]; mask: bool [T, past + T]. Returns output and the K/V of x."""
        new = self.project_kv(x, positions)
        keys = new if past is None else past.cat(new)
        return self.attend(x, positions, keys, mask), new


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderBlock(nn.Module):
    """Pre-norm self-attention + MLP, the shape of one target decoder layer but narrower."""

    def __init__(self, width: int, heads: int, mlp_hidden: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.mlp_norm = nn.RMSNorm(width, eps=1e-6)
        self.mlp = MLP(width, mlp_hidden)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past: KV | None = None
                ) -> tuple[torch.Tensor, KV]:
        a, kv = self.attn(self.attn_norm(x), positions, mask, past)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), kv
