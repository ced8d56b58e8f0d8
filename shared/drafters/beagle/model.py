"""Beagle: a cross-attention drafter (Budget EAGLE).

The query of position t is the token embedding of c_t; keys and values are *states*: the
target's LM-head input h_j for verified tokens, or the drafter's own predicted state for
drafted ones. Query t sees states j < t only (the diagonal is masked: h_t is what it must
predict) and predicts h_t, which the target's frozen LM head turns into the distribution
of c_{t+1}. Queries never attend to each other, so the only cache is the states' K/V (the
"memory"), one entry per position, whatever the draft depth.

A block: pre-norm cross-attention into the memory + SwiGLU MLP. Each block projects the
memory with its own K/V, so ``memory`` returns one ``KV`` per block.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from edgespec.shared.drafters.blocks import KV, MLP, Attention
from edgespec.shared.drafters.checkpoint import load_module, save_weights

KIND = "beagle"
FILE_NAME = "beagle.safetensors"
Memory = list[KV]  # per block: keys/values of the states, [H, S, D] each (after RoPE)


@dataclass(frozen=True)
class BeagleConfig:
    hidden_size: int  # E: the target's hidden size (state and embedding width)
    width: int = 512  # the drafter's internal width; narrower than E keeps it cheap on a laptop
    heads: int = 8  # attention heads of each cross-attention
    mlp_hidden: int = 1024  # SwiGLU hidden size of each block
    blocks: int = 1  # cross-attention blocks (the paper uses one)
    rope_theta: float = 10000.0  # RoPE base of the cross-attention (queries and state keys)


def with_sink(keys: KV, mask: torch.Tensor) -> tuple[KV, torch.Tensor]:
    """Prepend a zero key/value every query sees: a query with no visible state (the first
    position) reads zeros instead of a softmax over nothing (NaN)."""
    zero = keys.k.new_zeros(keys.k.shape[0], 1, keys.k.shape[2])
    sink = torch.ones(mask.shape[0], 1, dtype=torch.bool, device=mask.device)
    return KV(torch.cat([zero, keys.k], 1), torch.cat([zero, keys.v], 1)), torch.cat([sink, mask], 1)


class CrossBlock(nn.Module):
    def __init__(self, config: BeagleConfig):
        super().__init__()
        w = config.width
        self.attn_norm = nn.RMSNorm(w, eps=1e-6)
        self.attn = Attention(w, config.heads, source_width=config.hidden_size, rope_theta=config.rope_theta)
        self.mlp_norm = nn.RMSNorm(w, eps=1e-6)
        self.mlp = MLP(w, config.mlp_hidden)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, memory: KV, mask: torch.Tensor) -> torch.Tensor:
        keys, mask = with_sink(memory, mask)
        x = x + self.attn.attend(self.attn_norm(x), positions, keys, mask)
        return x + self.mlp(self.mlp_norm(x))


class BeagleHead(nn.Module):
    def __init__(self, config: BeagleConfig):
        super().__init__()
        if config.blocks < 1:
            raise ValueError(f"a Beagle drafter needs at least one block, got {config.blocks}")
        self.config = config
        e, w = config.hidden_size, config.width
        self.query_in = nn.Linear(e, w, bias=False)
        self.state_norm = nn.RMSNorm(e, eps=1e-6)  # target states carry a few huge channels
        self.blocks = nn.ModuleList([CrossBlock(config) for _ in range(config.blocks)])
        self.out_norm = nn.RMSNorm(w, eps=1e-6)
        self.out = nn.Linear(w, e, bias=True)

    @property
    def dtype(self) -> torch.dtype:
        return self.query_in.weight.dtype

    def memory(self, states: torch.Tensor, positions: torch.Tensor) -> Memory:
        """states: [S, E] at positions [S] -> each block's K/V of them."""
        s = self.state_norm(states.to(self.dtype))
        return [b.attn.project_kv(s, positions) for b in self.blocks]

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, memory: Memory, mask: torch.Tensor
                ) -> torch.Tensor:
        """embeds: [T, E] token embeddings at positions [T]; mask: bool [T, S] over the memory's S states.
        Returns the predicted states [T, E]."""
        x = self.query_in(embeds.to(self.dtype))
        for block, kv in zip(self.blocks, memory):
            x = block(x, positions, kv, mask)
        return self.out(self.out_norm(x))


def cat_memory(a: Memory | None, b: Memory) -> Memory:
    return b if a is None else [x.cat(y) for x, y in zip(a, b)]


def take_memory(m: Memory, index: slice | torch.Tensor) -> Memory:
    return [kv.take(index) for kv in m]


def save_beagle(head: BeagleHead, path: str | Path, vocab_ids: torch.Tensor | None = None,
                dtype: torch.dtype = torch.bfloat16) -> Path:
    return save_weights(path, KIND, asdict(head.config), head.state_dict(), vocab_ids, dtype)


def load_beagle(path: str | Path) -> tuple[BeagleHead, torch.Tensor | None]:
    """(head in float32 eval mode, reduced-vocabulary ids or None)."""
    return load_module(path, KIND, lambda config: BeagleHead(BeagleConfig(**config)))
