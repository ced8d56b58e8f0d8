"""A MoA drafter's two halves together: the server's Layer Self-Attention (``lsa``) and the client part
(``client_part``), as training builds them and a run folder holds them (``server.safetensors`` beside
``client.safetensors``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from edgespec.shared.drafters.checkpoint import save_weights

from .client_part import KIND, MoAClient, MoAConfig, load_moa_client
from .lsa import LayerSelfAttention, LSAConfig, load_server_part, save_server_part


@dataclass
class MoADrafterModel:
    """Both halves of a MoA drafter: ``lsa`` runs on the server, ``client`` on the client."""

    lsa: LayerSelfAttention
    client: MoAClient
    vocab_ids: torch.Tensor | None = None  # reduced draft vocabulary (draft id -> target id), or None


def new_moa(config: MoAConfig) -> MoADrafterModel:
    return MoADrafterModel(LayerSelfAttention(LSAConfig(config.num_layers, config.kv_size, config.lsa_heads)),
                           MoAClient(config))


def save_moa(model: MoADrafterModel, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Writes ``server.safetensors`` (the LSA) and ``client.safetensors`` (the rest) into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Cast as written: loading a cast state dict into a new float32 module (as this did) cast it back.
    save_server_part(model.lsa, out / "server.safetensors", dtype)
    save_weights(out / "client.safetensors", KIND, asdict(model.client.config), model.client.state_dict(),
                 model.vocab_ids, dtype)
    return out


def load_moa(out_dir: str | Path) -> MoADrafterModel:
    client, vocab_ids = load_moa_client(out_dir)
    lsa = load_server_part(Path(out_dir) / "server.safetensors").float()
    return MoADrafterModel(lsa, client, vocab_ids)
