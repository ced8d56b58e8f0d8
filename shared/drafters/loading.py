"""Open a trained drafter for drafting: checkpoint + the target's own frozen parts.

``open_drafter(path, target_model)`` accepts an ``eagle.safetensors`` or ``beagle.safetensors``
file, a MoA folder (``client.safetensors`` + ``server.safetensors``), or a run folder holding
exactly one of them, and returns the drafting runtime (``EagleDrafter``, ``BeagleDrafter`` or
``MoADrafter``). The server side of MoA opens its half with ``open_moa_server_part``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .beagle import load_beagle
from .beagle_drafter import BeagleDrafter
from .checkpoint import DrafterCheckpointError
from .eagle import load_eagle
from .eagle_drafter import EagleDrafter
from .lsa import LayerSelfAttention, load_server_part
from .moa import load_moa_client
from .moa_drafter import MoADrafter
from .router import attach_router_if_present
from .shipped import file_kind
from .target_parts import TargetParts, load_target_parts


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


def open_drafter(path: str | Path, target, dtype: torch.dtype = torch.float32, router: bool = True
                 ) -> EagleDrafter | BeagleDrafter | MoADrafter:
    """``target``: a loaded *ForCausalLM, or its registry name / folder: then only the parts the
    drafter needs are read from its files (``target_parts.load_target_parts``). A ``router.safetensors``
    beside the drafter (CORAL's LM-head router) is attached unless ``router`` is False."""
    ckpt = find_checkpoint(path)
    runtime = _open_runtime(ckpt, target, dtype)
    attach_router_if_present(runtime, ckpt, enabled=router)
    return runtime


def _open_runtime(ckpt: Path, target, dtype: torch.dtype) -> EagleDrafter | BeagleDrafter | MoADrafter:
    if ckpt.is_file() and file_kind(ckpt) == "beagle":
        head, vocab_ids = load_beagle(ckpt)
        parts = _parts(target, 0, vocab_ids, dtype)
        _check_fits(ckpt, parts, hidden_size=head.config.hidden_size)
        return BeagleDrafter(head.to(dtype), parts)
    if ckpt.is_file():
        head, vocab_ids = load_eagle(ckpt)
        parts = _parts(target, 0, vocab_ids, dtype)
        _check_fits(ckpt, parts, hidden_size=head.config.hidden_size)
        return EagleDrafter(head.to(dtype), parts)
    client, vocab_ids = load_moa_client(ckpt)
    parts = _parts(target, client.config.tli, vocab_ids, dtype)
    c = client.config
    _check_fits(ckpt, parts, hidden_size=c.hidden_size, num_layers=c.num_layers, kv_size=c.kv_size)
    return MoADrafter(client.to(dtype), parts)


def _parts(target, tli: int, vocab_ids, dtype) -> TargetParts:
    if isinstance(target, (str, Path)):
        return load_target_parts(str(target), tli, vocab_ids, dtype)
    return TargetParts(target, tli, vocab_ids, dtype)


def open_moa_server_part(path: str | Path, device: str | torch.device = "cpu") -> LayerSelfAttention:
    """A ``server.safetensors`` file, a MoA checkpoint folder, or a shipped checkpoint's name."""
    from .shipped import resolve_checkpoint

    path = resolve_checkpoint(path)
    if path.is_file() and path.name == "server.safetensors":
        return load_server_part(path, device)
    ckpt = find_checkpoint(path)
    if ckpt.is_file():
        raise DrafterCheckpointError(f"{ckpt} is an EAGLE drafter: it has no server part")
    return load_server_part(ckpt / "server.safetensors", device)


def _check_fits(ckpt: Path, parts: TargetParts, **trained: int) -> None:
    """A drafter made for another target produces garbage, not an error: refuse it here."""
    actual = {k: getattr(parts.shape, k) for k in trained}
    if trained != actual:
        raise DrafterCheckpointError(f"{ckpt} was trained for a target with {trained}, this target has {actual}")
