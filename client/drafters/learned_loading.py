"""Opening a learned drafter's checkpoint on the client: which target files, which checks.

The runtime needs the target's own embedding, final norm and LM head (and, for MoA with
TLI = N, its last N layers), read from the target's files on the laptop. Which target:
``DrafterOptions.target`` when given, else the server's model (its registry name), else
the one the checkpoint's card was trained for. Before anything runs, the checkpoint's
tokenizer fingerprint must equal the server's: a drafter of another tokenizer would draft
ids that mean other tokens.
"""
from __future__ import annotations

from pathlib import Path

import torch

from edgespec.shared.drafters.checkpoint import DrafterCheckpointError
from edgespec.shared.drafters.loading import open_drafter
from edgespec.shared.drafters.shipped import checkpoint_kind, read_card, resolve_checkpoint
from edgespec.shared.errors import TokenizerMismatchError


def _dtype(name: str | None) -> torch.dtype:
    # float32 by default: a laptop CPU without bf16 units runs the drafter's small matmuls faster in it
    return getattr(torch, name) if name else torch.float32


def pick_target(options, server_info, card: dict) -> str:
    if options.target:
        return options.target
    if server_info is not None and server_info.model_name:
        from edgespec.shared.models.loading import model_location

        try:
            model_location(server_info.model_name)
            return server_info.model_name
        except Exception:  # noqa: BLE001 - the server's model is not on this machine: fall back to the card
            pass
    if card.get("target"):
        return card["target"]
    raise DrafterCheckpointError("cannot tell which target's embedding and LM head this drafter uses: "
                                 "pass the target's name or directory (DrafterOptions.target / --target-model)")


def open_learned(kind: str, options, server_info, default_checkpoint: str):
    """(runtime, checkpoint name, card) for an EAGLE or MoA checkpoint."""
    where = resolve_checkpoint(options.checkpoint or default_checkpoint)
    found = checkpoint_kind(where)
    if found != kind:
        raise DrafterCheckpointError(f"{where} holds a {found} drafter, not {kind}")
    card = read_card(where)
    fingerprint = card.get("tokenizer_fingerprint")
    if server_info is not None and fingerprint and server_info.tokenizer_fingerprint \
            and fingerprint != server_info.tokenizer_fingerprint:
        raise TokenizerMismatchError(
            f"drafter {where} was trained for a target with tokenizer {fingerprint[:12]}..., but the server's "
            f"{server_info.model_name} has {server_info.tokenizer_fingerprint[:12]}...: use a drafter trained for "
            f"this target")
    runtime = open_drafter(where, pick_target(options, server_info, card), dtype=_dtype(options.dtype),
                           router=getattr(options, "router", True))
    name = Path(where).name if Path(where).is_dir() else Path(where).stem
    return runtime, name, card
