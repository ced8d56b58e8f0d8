"""Drafter checkpoints by name: the ones shipped with edgespec, or any folder / file on disk.

A shipped checkpoint is a folder ``shared/drafters/checkpoints/<name>/`` holding the
drafter's weights (``eagle.safetensors``, or MoA's ``client.safetensors`` and
``server.safetensors``) and ``card.json`` (target, tokenizer fingerprint, how it was
trained, what it measured). Client and server resolve the same names, so
``--drafter moa-tli0`` on the laptop and ``--moa-server-part moa-tli0`` on the GPU box
mean the same weights. (``independent-vocab/`` there holds the independent drafter's reduced
vocabularies: no card, so not a drafter.)
"""
from __future__ import annotations

import json
from pathlib import Path

from .checkpoint import DrafterCheckpointError

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"


def shipped_names() -> list[str]:
    if not CHECKPOINT_DIR.is_dir():
        return []
    return sorted(p.name for p in CHECKPOINT_DIR.iterdir() if (p / "card.json").is_file())


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """The folder or file of a shipped name, or the given path when it exists."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = CHECKPOINT_DIR / str(name_or_path)
    if "/" not in str(name_or_path) and (shipped / "card.json").is_file():
        return shipped
    names = ", ".join(shipped_names()) or "none in this build"
    raise DrafterCheckpointError(f"no drafter checkpoint {str(name_or_path)!r}: not a file or folder, and not a "
                                 f"shipped checkpoint (shipped: {names})")


def read_card(path: str | Path) -> dict:
    """The ``card.json`` at a checkpoint (beside a file, inside a folder, or in its parent); {} if none."""
    path = Path(path)
    for folder in ([path] if path.is_dir() else []) + [path.parent]:
        card = folder / "card.json"
        if card.is_file():
            return json.loads(card.read_text(encoding="utf-8"))
    return {}


def checkpoint_kind(path: str | Path) -> str:
    """"eagle", "beagle" or "moa", from the files present."""
    path = Path(path)
    if path.is_file():
        return "beagle" if file_kind(path) == "beagle" else "eagle"
    if (path / "beagle.safetensors").is_file():
        return "beagle"
    if (path / "eagle.safetensors").is_file():
        return "eagle"
    if (path / "client.safetensors").is_file() or any(path.glob("*/client.safetensors")):
        return "moa"
    raise DrafterCheckpointError(f"{path} holds no EAGLE, Beagle or MoA drafter")


def file_kind(path: str | Path) -> str:
    """The drafter kind a single-file checkpoint records in its metadata ("" when none)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("kind", "")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own types for a file that is not one
        raise DrafterCheckpointError(f"{path} is not a safetensors drafter checkpoint: {exc}") from None
