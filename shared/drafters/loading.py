"""Finding a drafter checkpoint's files, and opening the half of MoA the server runs.

``find_checkpoint(path)`` accepts an ``eagle.safetensors`` or ``beagle.safetensors`` file, a
MoA folder (``client.safetensors`` + ``server.safetensors``), or a run folder holding exactly
one of them. The client opens the drafting runtime (``client/drafters/learned_loading.py``);
the server opens MoA's Layer Self-Attention with ``open_moa_server_part``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .checkpoint import DrafterCheckpointError
from .lsa import LayerSelfAttention, load_server_part
from .shipped import resolve_checkpoint


def find_checkpoint(path: str | Path) -> Path:
    """The eagle / beagle file or MoA folder at (or directly inside) ``path``."""
    path = Path(path)
    if path.is_file() or (path / "client.safetensors").is_file():
        return path
    found = (sorted(path.glob("eagle.safetensors")) + sorted(path.glob("beagle.safetensors"))
             + sorted(p.parent for p in path.glob("*/client.safetensors")))
    if len(found) != 1:
        what = "nothing" if not found else ", ".join(map(str, found))
        raise DrafterCheckpointError(f"expected one drafter checkpoint in {path}, found {what}")
    return found[0]


def open_moa_server_part(path: str | Path, device: str | torch.device = "cpu") -> LayerSelfAttention:
    """A ``server.safetensors`` file, a MoA checkpoint folder, or a shipped checkpoint's name."""
    path = resolve_checkpoint(path)
    if path.is_file() and path.name == "server.safetensors":
        return load_server_part(path, device)
    ckpt = find_checkpoint(path)
    if ckpt.is_file():
        raise DrafterCheckpointError(f"{ckpt} is an EAGLE drafter: it has no server part")
    return load_server_part(ckpt / "server.safetensors", device)
