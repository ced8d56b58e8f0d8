"""Building blocks of the learned drafters: our own small attention layers.

Every attention here takes explicit positions and an explicit boolean mask over
[past keys ; keys of this call], so one forward serves teacher-forced training
(causal mask), unrolled training (past = earlier steps) and drafting (past = the
drafter's cache, mask = tree visibility).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .masks import additive


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
