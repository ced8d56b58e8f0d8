"""Mixture of Attentions, client part: Self-Attention over token embeddings, Cross-Attention
into the Layer Self-Attention outputs of verified tokens, then (TLI = N) the target's last
N layers, its norm and LM head.

The client part predicts the target's activation entering layer L-N (N = 0: the residual
stream before the final norm). Its Cross-Attention memory is the LSA output (2*E_kv per
token, computed on the server by ``lsa.LayerSelfAttention``) of verified tokens only; a
learned null slot lets a query attend somewhere when nothing is verified yet.

This module is all the client's drafting runtime needs of MoA: it names neither the server part
(``lsa``) nor the two halves together (``model``: what training builds, saves and ships).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edgespec.shared.drafters.blocks import KV, MLP, Attention
from edgespec.shared.drafters.checkpoint import load_module

KIND = "moa"
SUPPORTED_TLI = (0, 1, 3)


@dataclass(frozen=True)
class MoAConfig:
    hidden_size: int  # E: the target's hidden size (embedding and predicted activation width)
    kv_size: int  # E_kv: the target's kv_heads * head_dim; memory rows are 2*E_kv wide
    num_layers: int  # L: the target's decoder layers (the LSA's layer axis)
    tli: int = 0  # N: the target's last N layers run on the client (0, 1 or 3)
    width: int = 512  # the client part's internal width
    heads: int = 8  # heads of its Self- and Cross-Attention
    mlp_hidden: int = 1024  # SwiGLU hidden size
    lsa_heads: int = 4  # heads of the server's Layer Self-Attention (must divide 2*E_kv)
    rope_theta: float = 10000.0  # RoPE base of the client part's attention

    def __post_init__(self) -> None:
        if self.tli not in SUPPORTED_TLI:
            raise ValueError(f"MoA supports TLI in {SUPPORTED_TLI}, got {self.tli}")


class MoAClient(nn.Module):
    def __init__(self, config: MoAConfig):
        super().__init__()
        self.config = config
        w = config.width
        self.inp = nn.Linear(config.hidden_size, w, bias=False)
        self.sa_norm = nn.RMSNorm(w, eps=1e-6)
        self.sa = Attention(w, config.heads, rope_theta=config.rope_theta)
        self.ca_norm = nn.RMSNorm(w, eps=1e-6)
        self.ca = Attention(w, config.heads, source_width=2 * config.kv_size, rope_theta=config.rope_theta)
        self.null_k = nn.Parameter(torch.zeros(config.heads, 1, w // config.heads))
        self.null_v = nn.Parameter(torch.zeros(config.heads, 1, w // config.heads))
        self.mlp_norm = nn.RMSNorm(w, eps=1e-6)
        self.mlp = MLP(w, config.mlp_hidden)
        self.out_norm = nn.RMSNorm(w, eps=1e-6)
        self.out = nn.Linear(w, config.hidden_size, bias=True)
        # The residual stream has a few channels far larger than the rest: the head predicts it
        # per channel standardised (x - mean) / scale; the stats come from the training data.
        self.register_buffer("act_mean", torch.zeros(config.hidden_size))
        self.register_buffer("act_scale", torch.ones(config.hidden_size))

    # -- pieces, so the drafting runtime can cache each one -------------------------------------
    def sa_input(self, embeds: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, E] -> the residual stream [T, W] that enters Self-Attention."""
        return self.inp(embeds.to(self.inp.weight.dtype))

    def sa_kv(self, x: torch.Tensor, positions: torch.Tensor) -> KV:
        return self.sa.project_kv(self.sa_norm(x), positions)

    def memory(self, lsa_out: torch.Tensor, positions: torch.Tensor) -> KV:
        """Cross-Attention keys/values of verified tokens: LSA output [M, 2*E_kv] at their positions."""
        return self.ca.project_kv(lsa_out.to(self.inp.weight.dtype), positions)

    def with_null(self, memory: KV) -> KV:
        return KV(self.null_k, self.null_v).cat(memory)

    def predict(self, x: torch.Tensor, positions: torch.Tensor, sa_keys: KV, sa_mask: torch.Tensor,
                memory: KV, memory_mask: torch.Tensor) -> torch.Tensor:
        """x: [T, W] (from ``sa_input``); sa_keys: K/V the queries may see under sa_mask [T, S];
        memory: K/V incl. the null slot first, under memory_mask [T, 1 + M].
        Returns the predicted activation [T, E]."""
        x = x + self.sa.attend(self.sa_norm(x), positions, sa_keys, sa_mask)
        x = x + self.ca.attend(self.ca_norm(x), positions, memory, memory_mask)
        x = x + self.mlp(self.mlp_norm(x))
        return self.out(self.out_norm(x)) * self.act_scale + self.act_mean

    def standardise(self, act: torch.Tensor) -> torch.Tensor:
        """Activation [T, E] in the per-channel standardised space the regression loss uses."""
        return (act - self.act_mean) / self.act_scale

    @torch.no_grad()
    def calibrate(self, activations: torch.Tensor) -> None:
        """Set the per-channel stats from target activations [N, E] (before training starts)."""
        self.act_mean.copy_(activations.mean(0))
        self.act_scale.copy_(activations.std(0).clamp_min(1e-3))

    def empty_kv(self, like: torch.Tensor) -> KV:
        z = like.new_zeros(self.config.heads, 0, self.config.width // self.config.heads)
        return KV(z, z.clone())


def load_moa_client(path: str | Path) -> tuple[MoAClient, torch.Tensor | None]:
    """The client part (``client.safetensors`` or its folder): (module in float32 eval mode, vocab ids)."""
    path = Path(path)
    if path.is_dir():
        path = path / "client.safetensors"
    return load_module(path, KIND, lambda config: MoAClient(MoAConfig(**config)))
