"""Drafter checkpoints: finding one by name or path, and reading and writing its files.

A checkpoint holds only the drafter's own weights (+ the reduced-vocabulary map) as safetensors
with the config (JSON) in the metadata: the target's embedding, norm, LM head and TLI layers come
from the target's files on the client. Weights are stored in a compact dtype (bf16 by default) to
keep a shipped drafter small.

Where one is: an ``eagle.safetensors`` or ``beagle.safetensors`` file, a MoA folder
(``client.safetensors`` + ``server.safetensors``), a run folder holding exactly one of them, or a
shipped checkpoint's name: ``checkpoints/<name>/`` beside this module, with ``card.json`` (target,
tokenizer fingerprint, how it was trained, what it measured). Client and server resolve the same
names, so ``--drafter moa-tli0`` on the laptop and ``--moa-server-part moa-tli0`` on the GPU box
mean the same weights. (``independent-vocab/`` there holds the independent drafter's reduced
vocabularies: no card, so not a drafter.) The client opens the drafting runtime
(``client/drafters/learned/loading.py``); the server opens MoA's Layer Self-Attention with
``moa.lsa.open_moa_server_part``. Nothing here imports a drafter family: each family's model module
builds on this one, never the other way round.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, TypeVar

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from edgespec.shared.errors import EdgespecError

M = TypeVar("M", bound=torch.nn.Module)
CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"


class DrafterCheckpointError(EdgespecError, ValueError, grpc_code="FAILED_PRECONDITION"):
    """A drafter checkpoint that is missing, of another kind, or does not fit its target."""


# -- finding one ---------------------------------------------------------------------------------
def shipped_names() -> list[str]:
    return sorted(card.parent.name for card in CHECKPOINT_DIR.glob("*/card.json") if card.is_file())


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


def read_card(path: str | Path) -> dict:
    """The ``card.json`` at a checkpoint (beside a file, inside a folder, or in its parent); {} if none."""
    path = Path(path)
    for folder in ([path] if path.is_dir() else []) + [path.parent]:
        card = folder / "card.json"
        if card.is_file():
            return json.loads(card.read_text(encoding="utf-8"))
    return {}


def checkpoint_kind(path: str | Path) -> str:
    """"eagle", "beagle" or "moa": the kind of the checkpoint at (or directly inside) ``path``."""
    found = find_checkpoint(path)
    if found.is_dir():
        return "moa"
    try:
        with safe_open(str(found), framework="pt") as f:
            kind = (f.metadata() or {}).get("kind", "")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own types for a file that is not one
        raise DrafterCheckpointError(f"{found} is not a safetensors drafter checkpoint: {exc}") from None
    return "beagle" if kind == "beagle" else "eagle"


# -- its files -----------------------------------------------------------------------------------
def save_weights(path: str | Path, kind: str, config: dict, state: dict[str, torch.Tensor],
                 vocab_ids: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().to(dtype if v.is_floating_point() else v.dtype).contiguous()
               for k, v in state.items()}
    if vocab_ids is not None:
        tensors["vocab_ids"] = vocab_ids.cpu().to(torch.int64).contiguous()
    save_file(tensors, str(path), metadata={"kind": kind, "config": json.dumps(config)})
    return path


def load_weights(path: str | Path, kind: str) -> tuple[dict, dict[str, torch.Tensor], torch.Tensor | None]:
    """(config, state dict in float32, vocab_ids or None)."""
    path = Path(path)
    if not path.is_file():
        raise DrafterCheckpointError(f"drafter checkpoint {path} does not exist")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("kind") != kind:
        raise DrafterCheckpointError(f"{path} holds a {meta.get('kind', 'unknown')!r} drafter, not {kind!r}")
    tensors = load_file(str(path))
    vocab_ids = tensors.pop("vocab_ids", None)
    state = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    return json.loads(meta["config"]), state, vocab_ids


def load_module(path: str | Path, kind: str, build: Callable[[dict], M]) -> tuple[M, torch.Tensor | None]:
    """(the module ``build(config)`` makes, with the file's weights, in float32 eval mode; vocab ids or None).

    A file whose weights do not fit the module its own config describes is refused here, by name,
    rather than failing later inside a forward pass.
    """
    config, state, vocab_ids = load_weights(path, kind)
    module = build(config)
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise DrafterCheckpointError(f"{path} does not match its own config: {exc}") from None
    return module.eval(), vocab_ids

