"""Drafters by name: ngram, independent, the learned kinds (``learned_loading``), shipped checkpoints."""
from __future__ import annotations

from dataclasses import dataclass, replace

from edgespec.shared.errors import EdgespecError
from edgespec.shared.models.registry import DEFAULT_DRAFTER

from .base import Drafter
from .ngram import NgramConfig
from .tree_builder import TreeShape

BUILTIN = ("ngram", "independent")
LEARNED = {"eagle": "eagle", "moa": "moa-tli0", "beagle": "beagle"}  # kind -> shipped checkpoint it opens by default


class UnknownDrafterError(EdgespecError, ValueError, grpc_code="INVALID_ARGUMENT"):
    """An unknown drafter name."""


@dataclass(frozen=True)
class DrafterOptions:
    """Which drafter to run and how."""

    name: str = "ngram"  # "ngram", "independent", "eagle", "moa", "beagle"
    model: str = DEFAULT_DRAFTER  # the small LM of `independent` (registry name or local directory)
    checkpoint: str | None = None  # learned drafters: shipped checkpoint name, folder or file
    target: str | None = None  # learned drafters: target whose embedding / LM head they use (None: the server's)
    moa_server_part: str | None = None  # MoA: the server part's name on the server (None: the checkpoint's name)
    router: bool = True  # learned drafters: use the checkpoint's LM-head router when it has one
    device: str | None = "cpu"  # where the drafter's model runs (the laptop: CPU)
    dtype: str | None = None  # its dtype; None = default_dtype: bf16 where the hardware has it, else float32
    tree: TreeShape = TreeShape()  # EAGLE-2 tree shape for drafters with next-token distributions
    ngram: NgramConfig = NgramConfig()  # prompt lookup settings


def _shipped() -> list[str]:
    from edgespec.shared.drafters.shipped import shipped_names

    return shipped_names()


def available_drafters() -> list[str]:
    out = [*BUILTIN, *LEARNED]
    return out + [n for n in _shipped() if n not in out]


def make_drafter(options: DrafterOptions, server_info=None) -> Drafter:
    """Build the drafter `options.name`; server_info (an InfoResponse) helps learned drafters check fit."""
    if options.name == "ngram":
        from .ngram import NgramDrafter

        return NgramDrafter(options.ngram)
    if options.name == "independent":
        from .independent import IndependentConfig, IndependentDrafter

        return IndependentDrafter.from_pretrained(options.model, IndependentConfig(options.tree),
                                                  device=options.device, dtype=options.dtype)
    if options.name not in LEARNED and options.name in _shipped():
        # a shipped checkpoint's name (e.g. "moa-tli0") picks its kind's drafter and that checkpoint
        from edgespec.shared.drafters.shipped import checkpoint_kind, resolve_checkpoint

        kind = checkpoint_kind(resolve_checkpoint(options.name))
        options = replace(options, name=kind, checkpoint=options.checkpoint or options.name)
    if options.name not in LEARNED:
        raise UnknownDrafterError(f"unknown drafter {options.name!r}; choose one of {', '.join(available_drafters())}")
    from .learned_loading import open_learned  # drafter models load only when one is asked for

    return open_learned(replace(options, checkpoint=options.checkpoint or LEARNED[options.name]), server_info)
