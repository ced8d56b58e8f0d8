"""Opening a learned drafter (EAGLE, MoA, Beagle) on the client: checkpoint + the target's own frozen parts.

The runtime needs the target's own embedding, final norm and LM head (and, for MoA with
TLI = N, its last N layers), read from the target's files on the laptop. Which target:
``DrafterOptions.target`` when given, else the server's model (its registry name), else
the one the checkpoint's card was trained for. Before anything runs, the checkpoint's
tokenizer fingerprint must equal the server's: a drafter of another tokenizer would draft
ids that mean other tokens. MoA's Layer Self-Attention runs on the server, which must hold
the checkpoint's server part under the name the client asks for.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from edgespec.shared.drafters.beagle import load_beagle
from edgespec.shared.drafters.checkpoint import DrafterCheckpointError
from edgespec.shared.drafters.eagle import load_eagle
from edgespec.shared.drafters.loading import find_checkpoint
from edgespec.shared.drafters.moa import load_moa_client
from edgespec.shared.drafters.router import attach_router_if_present
from edgespec.shared.drafters.shipped import checkpoint_kind, file_kind, read_card, resolve_checkpoint
from edgespec.shared.drafters.target_parts import TargetParts, load_target_parts
from edgespec.shared.errors import TokenizerMismatchError
from edgespec.shared.wire import FeatureKind

from .base import FeatureNeeds
from .beagle_runtime import BeagleRuntime
from .eagle_runtime import EagleRuntime
from .learned import LearnedDrafter
from .moa_runtime import MoARuntime
from .runtime import LearnedRuntime
from .tree_builder import TreeShape

if TYPE_CHECKING:
    from .factory import DrafterOptions


def open_runtime(path: str | Path, target, dtype: torch.dtype = torch.float32, router: bool = True) -> LearnedRuntime:
    """The drafting runtime of the checkpoint at ``path`` (see ``find_checkpoint``). ``target``: a loaded
    *ForCausalLM, or its registry name / folder: then only the parts the drafter needs are read from its
    files. A ``router.safetensors`` beside the drafter (CORAL's LM-head router) is attached unless
    ``router`` is False."""
    ckpt = find_checkpoint(path)
    runtime = _open(ckpt, target, dtype)
    attach_router_if_present(runtime, ckpt, enabled=router)
    return runtime


def _open(ckpt: Path, target, dtype: torch.dtype) -> LearnedRuntime:
    if ckpt.is_file() and file_kind(ckpt) == "beagle":
        head, vocab_ids = load_beagle(ckpt)
        parts = _parts(target, 0, vocab_ids, dtype)
        _check_fits(ckpt, parts, hidden_size=head.config.hidden_size)
        return BeagleRuntime(head.to(dtype), parts)
    if ckpt.is_file():
        head, vocab_ids = load_eagle(ckpt)
        parts = _parts(target, 0, vocab_ids, dtype)
        _check_fits(ckpt, parts, hidden_size=head.config.hidden_size)
        return EagleRuntime(head.to(dtype), parts)
    client, vocab_ids = load_moa_client(ckpt)
    parts = _parts(target, client.config.tli, vocab_ids, dtype)
    c = client.config
    _check_fits(ckpt, parts, hidden_size=c.hidden_size, num_layers=c.num_layers, kv_size=c.kv_size)
    return MoARuntime(client.to(dtype), parts)


def _parts(target, tli: int, vocab_ids: torch.Tensor | None, dtype: torch.dtype) -> TargetParts:
    if isinstance(target, (str, Path)):
        return load_target_parts(str(target), tli, vocab_ids, dtype)
    return TargetParts(target, tli, vocab_ids, dtype)


def _check_fits(ckpt: Path, parts: TargetParts, **trained: int) -> None:
    """A drafter made for another target produces garbage, not an error: refuse it here."""
    actual = {k: getattr(parts.shape, k) for k in trained}
    if trained != actual:
        raise DrafterCheckpointError(f"{ckpt} was trained for a target with {trained}, this target has {actual}")


def learned_drafter(runtime: LearnedRuntime, tree: TreeShape, moa_server_part: str = "") -> LearnedDrafter:
    """The client's ``Drafter`` over a runtime; MoA's features come from the server part ``moa_server_part``."""
    if isinstance(runtime, MoARuntime):
        tli = runtime.parts.tli
        return LearnedDrafter(f"moa-tli{tli}", runtime, FeatureNeeds(FeatureKind.MOA, moa_server_part, tli), tree)
    return LearnedDrafter(runtime.name.lower(), runtime, FeatureNeeds(FeatureKind.LAST_HIDDEN), tree)


def _dtype(name: str | None) -> torch.dtype:
    # float32 by default: a laptop CPU without bf16 units runs the drafter's small matmuls faster in it
    return getattr(torch, name) if name else torch.float32


def pick_target(options: DrafterOptions, server_info, card: dict) -> str:
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


def open_learned(options: DrafterOptions, server_info=None) -> LearnedDrafter:
    """The drafter of kind ``options.name`` ("eagle", "moa", "beagle") from ``options.checkpoint``;
    ``server_info`` (an InfoResponse) checks that it fits the server."""
    kind, where = options.name, resolve_checkpoint(options.checkpoint)
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
    runtime = open_runtime(where, pick_target(options, server_info, card), _dtype(options.dtype), options.router)
    if not isinstance(runtime, MoARuntime):
        return learned_drafter(runtime, options.tree)
    name = where.name
    part = options.moa_server_part or name
    if server_info is not None and part not in server_info.moa_server_parts:
        # another part's features would make the drafter guess blindly
        have = ", ".join(server_info.moa_server_parts) or "none"
        raise DrafterCheckpointError(
            f"the server has no MoA server part {part!r} (it has: {have}); start it with "
            f"--moa-server-part {part}" + ("" if part == name else "=PATH"))
    return learned_drafter(runtime, options.tree, part)
