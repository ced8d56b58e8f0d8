"""Drafters by name. Learned drafters (eagle, moa, beagle) live in their own modules and plug in here.

A drafter module outside this file provides ``from_options(options, server_info) -> Drafter``.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from edgespec.shared.errors import EdgespecError
from edgespec.shared.models.registry import DEFAULT_DRAFTER

from .base import Drafter
from .ngram import NgramConfig
from .tree_builder import TreeShape

# name -> module providing from_options(); ngram and independent are built here.
PLUGIN_MODULES = {"eagle": "edgespec.client.drafters.eagle", "moa": "edgespec.client.drafters.moa",
                  "beagle": "edgespec.client.drafters.beagle"}
BUILTIN = ("ngram", "independent")


class UnknownDrafterError(EdgespecError, ValueError):
    grpc_code = "INVALID_ARGUMENT"


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
    dtype: str | None = None  # its dtype; None = bfloat16
    tree: TreeShape = TreeShape()  # EAGLE-2 tree shape for drafters with next-token distributions
    ngram: NgramConfig = NgramConfig()  # prompt lookup settings


def _shipped() -> list[str]:
    from edgespec.shared.drafters.shipped import shipped_names

    return shipped_names()


def available_drafters() -> list[str]:
    out = list(BUILTIN)
    for name, module in PLUGIN_MODULES.items():
        try:
            if importlib.util.find_spec(module) is not None:
                out.append(name)
        except ModuleNotFoundError:
            pass
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
    if options.name not in PLUGIN_MODULES and options.name in _shipped():
        # a shipped checkpoint's name (e.g. "moa-tli0") picks its kind's drafter and that checkpoint
        from dataclasses import replace

        from edgespec.shared.drafters.shipped import checkpoint_kind, resolve_checkpoint

        kind = checkpoint_kind(resolve_checkpoint(options.name))
        options = replace(options, name=kind, checkpoint=options.checkpoint or options.name)
    module = PLUGIN_MODULES.get(options.name)
    if module is None:
        raise UnknownDrafterError(f"unknown drafter {options.name!r}; choose one of {', '.join(available_drafters())}")
    try:
        plugin = importlib.import_module(module)
    except ModuleNotFoundError:
        raise UnknownDrafterError(f"the {options.name!r} drafter is not installed in this build "
                                  f"(no module {module}); choose one of {', '.join(available_drafters())}") from None
    return plugin.from_options(options, server_info)
