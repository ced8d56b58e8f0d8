"""EAGLE-2 head: predicts the target's next LM-head input from [token ; feature].

Row r of the head reads the pair (feature f_r, token c_{r+1}) at position r and
predicts the feature of position r+1, which the target's frozen LM head turns
into the distribution of c_{r+2}. While drafting, f_r is the target's own
feature (sent by the server, one token behind) for verified tokens and the
head's previous prediction beyond them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from edgespec.shared.drafters.blocks import KV, DecoderBlock
from edgespec.shared.drafters.checkpoint import load_module, save_weights

KIND = "eagle"


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int  # E: the target's hidden size (feature and embedding width)
    width: int = 512  # the head's internal width; narrower than E keeps it cheap on a laptop
    heads: int = 8  # attention heads of the decoder block
    mlp_hidden: int = 1024  # SwiGLU hidden size of the decoder block
    rope_theta: float = 10000.0  # RoPE base of the head's own attention


class EagleHead(nn.Module):
    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        e, w = config.hidden_size, config.width
        self.fc = nn.Linear(2 * e, w, bias=False)
        self.block = DecoderBlock(w, config.heads, config.mlp_hidden)
        self.out_norm = nn.RMSNorm(w, eps=1e-6)
        self.out = nn.Linear(w, e, bias=True)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past: KV | None = None) -> tuple[torch.Tensor, KV]:
        """embeds, features: [T, E]; positions: [T]; mask: bool [T, past + T].
        Returns predicted features [T, E] and the block's K/V of these rows."""
        x = self.fc(torch.cat([embeds, features], dim=-1).to(self.fc.weight.dtype))
        x, kv = self.block(x, positions, mask, past)
        return self.out(self.out_norm(x)), kv


def save_eagle(head: EagleHead, path: str | Path, vocab_ids: torch.Tensor | None = None,
               dtype: torch.dtype = torch.bfloat16) -> Path:
    return save_weights(path, KIND, asdict(head.config), head.state_dict(), vocab_ids, dtype)


def load_eagle(path: str | Path) -> tuple[EagleHead, torch.Tensor | None]:
    """(head in float32 eval mode, reduced-vocabulary ids or None)."""
    return load_module(path, KIND, lambda config: EagleHead(EagleConfig(**config)))
