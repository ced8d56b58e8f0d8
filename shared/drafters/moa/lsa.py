"""Layer Self-Attention: MoA's server part.

Per token, the target's K|V of every layer form a short sequence along the layer
axis ([L, 2*E_kv]). Attention across that axis (full mask: every layer sees every
layer) followed by a mean over layers compresses them to 2*E_kv values, which
is what crosses the link (proto/README.md, the service). It runs on the server, once per
verification, because its input (all layers' KV) is too big to send.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from edgespec.shared.codec import ActivationCodec, decode_frame

from edgespec.shared.drafters.checkpoint import DrafterCheckpointError, find_checkpoint, resolve_checkpoint


@dataclass(frozen=True)
class LSAConfig:
    num_layers: int  # L: decoder layers of the target
    kv_size: int  # E_kv: num_kv_heads * head_dim of the target; rows are 2*E_kv wide (K then V)
    num_heads: int = 4  # attention heads across the layer axis; must divide 2*E_kv


class LayerSelfAttention(nn.Module):
    def __init__(self, config: LSAConfig):
        super().__init__()
        self.config = config
        width = 2 * config.kv_size
        # Which layer a row came from: attention across layers is otherwise order-blind.
        self.layer_embedding = nn.Parameter(torch.zeros(config.num_layers, width))
        self.norm = nn.RMSNorm(width, eps=1e-6)
        self.attn = nn.MultiheadAttention(width, config.num_heads, batch_first=True, bias=False)

    def forward(self, kv: torch.Tensor) -> torch.Tensor:
        # kv: [T, L, 2*E_kv] -> [T, 2*E_kv]
        x = self.norm(kv + self.layer_embedding)
        mixed, _ = self.attn(x, x, x, need_weights=False)
        return (kv + mixed).mean(dim=1)


def as_received(lsa_out: torch.Tensor, codec: ActivationCodec | None) -> torch.Tensor:
    """The LSA output [T, 2*E_kv] as a client reads it off the wire: encoded by ``codec`` and decoded.

    The server rounds the LSA's output, not its input: it runs the LSA on the target's exact K/V and
    encodes the result (``server/features.py``), so training rounds the same tensor at the same place
    (MoA's recipe, with the client's codec, INT8_OUTLIER by default), through the codec itself rather
    than an imitation of it. The gradient passes straight through the rounding, which has none.
    ``codec`` None: unrounded. The rows form one frame, whose outlier channels they choose together,
    as a verification's rows do on the wire.
    """
    if codec is None:
        return lsa_out
    frame = replace(codec, zstd_level=0).encode(lsa_out.detach().float())  # zstd is lossless: skip its time
    received = decode_frame(frame).to(lsa_out.device, lsa_out.dtype)
    return lsa_out + (received - lsa_out).detach()


def save_server_part(module: LayerSelfAttention, path: str | Path, dtype: torch.dtype | None = None) -> None:
    """safetensors with the config in its metadata; the weights in ``dtype`` (None: as they are)."""
    meta = {k: str(v) for k, v in asdict(module.config).items()}
    cast = (lambda v: v) if dtype is None else (lambda v: v.to(dtype) if v.is_floating_point() else v)  # noqa: E731
    save_file({k: cast(v.detach().cpu()).contiguous() for k, v in module.state_dict().items()}, str(path),
              metadata=meta)


def load_server_part(path: str | Path, device: str | torch.device = "cpu") -> LayerSelfAttention:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    try:
        config = LSAConfig(int(meta["num_layers"]), int(meta["kv_size"]), int(meta["num_heads"]))
    except KeyError as exc:
        raise ValueError(f"{path} is not a MoA server part: its metadata lacks {exc}") from None
    module = LayerSelfAttention(config)
    module.load_state_dict(load_file(str(path)))
    return module.to(device).eval()


def open_moa_server_part(path: str | Path, device: str | torch.device = "cpu") -> LayerSelfAttention:
    """MoA's Layer Self-Attention, which the server runs: a ``server.safetensors`` file, a MoA checkpoint
    folder, or a shipped checkpoint's name."""
    path = resolve_checkpoint(path)
    if path.is_file() and path.name == "server.safetensors":
        return load_server_part(path, device)
    ckpt = find_checkpoint(path)
    if ckpt.is_file():
        raise DrafterCheckpointError(f"{ckpt} is an EAGLE drafter: it has no server part")
    return load_server_part(ckpt / "server.safetensors", device)
