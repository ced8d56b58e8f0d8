"""Drafters by name: the one place a drafter is built from its name, for the CLI, ``client serve``, the
Python API, the benchmarks and the tests: ngram, independent, the learned kinds and the shipped checkpoints.

Opening a learned drafter: its checkpoint (``shared/drafters/checkpoint.py``) and the target's own frozen
parts, which the runtime (``learned.loading``) reads from the target's files on the laptop. Which target:
``DrafterOptions.target`` when given, else the server's model (its registry name), else the one the
checkpoint's card was trained for. Before anything loads, the checkpoint's tokenizer fingerprint must
equal the server's (a drafter of another tokenizer would draft ids that mean other tokens), and MoA's
server part (its Layer Self-Attention runs on the server) must be there under the name the client asks for.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from edgespec.shared.drafters.checkpoint import (DrafterCheckpointError, checkpoint_kind, find_checkpoint,
                                                 read_card, resolve_checkpoint, shipped_names)
from edgespec.shared.errors import EdgespecError, TokenizerMismatchError
from edgespec.shared.models.registry import DEFAULT_DRAFTER

from .ngram import NgramConfig
from .tree_builder import TreeShape
from .with_lookup import MERGED_LOOKUP

if TYPE_CHECKING:
    from .base import Drafter

BUILTIN = ("ngram", "independent")
LEARNED = {"eagle": "eagle", "moa": "moa-tli0", "beagle": "beagle"}  # kind -> shipped checkpoint it opens by default
LOOKUP_SUFFIX = "+ngram"  # NAME+ngram: drafter NAME's trees with prompt lookup's continuations merged in


def split_lookup(name: str) -> tuple[str, bool]:
    """A drafter's name without ``+ngram``, and whether it had it."""
    return (name[: -len(LOOKUP_SUFFIX)], True) if name.endswith(LOOKUP_SUFFIX) else (name, False)


class UnknownDrafterError(EdgespecError, ValueError, grpc_code="INVALID_ARGUMENT"):
    """An unknown drafter name."""


@dataclass(frozen=True)
class DrafterOptions:
    """Which drafter to run and how."""

    name: str = "ngram"  # "ngram", "independent", "eagle", "moa", "beagle" or a shipped checkpoint's name
    model: str = DEFAULT_DRAFTER  # the small LM of `independent` (registry name or local directory)
    checkpoint: str | None = None  # learned drafters: shipped checkpoint name, folder or file
    target: str | None = None  # learned drafters: target whose embedding / LM head they use (None: the server's)
    moa_server_part: str | None = None  # MoA: the server part's name on the server (None: the checkpoint's name)
    router: bool = True  # learned drafters: use the checkpoint's LM-head router when it has one
    device: str | None = "cpu"  # where the drafter's model runs (the laptop: CPU)
    dtype: str | None = None  # None: default_dtype's, bf16 where the hardware has it, else float32
    tree: TreeShape = TreeShape()  # EAGLE-2 tree shape for drafters with next-token distributions
    weights: str | None = None  # independent: "int4-mlp", "int8" or "float" (None: IndependentConfig's default)
    draft_vocab: int | None = None  # independent and learned: draft over the N most frequent ids, 0 = all (None: the default)
    context_vocab: bool | None = None  # independent and learned: the committed text's ids as well (None: the default)
    ngram: NgramConfig = NgramConfig()  # prompt lookup settings
    lookup: NgramConfig = MERGED_LOOKUP  # NAME+ngram: the lookup merged into a model drafter's trees


def available_drafters() -> list[str]:
    """Every name make_drafter takes: the built-in drafters, the learned kinds, the shipped checkpoints (each of
    them but ngram also as NAME+ngram)."""
    out = [*BUILTIN, *LEARNED]
    return out + [n for n in shipped_names() if n not in out]


def make_drafter(options: DrafterOptions, server_info=None, small_model=None, tokenizer=None) -> Drafter:
    """Build the drafter ``options.name``. ``server_info`` (an InfoResponse) checks that a learned drafter fits
    the server; ``small_model``: the independent drafter's LM already loaded (a benchmark shares one across
    drafters and with its baselines), else ``options.model`` is loaded; ``tokenizer``: the one that picks its draft
    vocabulary's list (a loaded model's own otherwise). NAME+ngram: drafter NAME with prompt lookup merged in."""
    base, lookup = split_lookup(options.name)
    if lookup:
        if base == "ngram":
            raise UnknownDrafterError("ngram+ngram is ngram: the +ngram suffix merges prompt lookup into a model "
                                      "drafter's trees")
        from .with_lookup import WithLookup

        base_drafter = make_drafter(replace(options, name=base), server_info, small_model, tokenizer)
        return WithLookup(base_drafter, options.lookup)
    if options.name == "ngram":
        from .ngram import NgramDrafter

        return NgramDrafter(options.ngram)
    if options.name == "independent":
        from .independent import IndependentConfig, IndependentDrafter, weights_config

        given = {k: v for k, v in (("draft_vocab", options.draft_vocab), ("context_vocab", options.context_vocab))
                 if v is not None}  # unset: IndependentConfig's defaults
        config = IndependentConfig(options.tree, **(weights_config(options.weights) if options.weights else {}),
                                   **given)
        if small_model is not None:
            return IndependentDrafter.from_model(small_model, config, tokenizer=tokenizer)
        return IndependentDrafter.from_pretrained(options.model, config, device=options.device, dtype=options.dtype)
    return _open_learned(_learned_kind(options), server_info)


def _learned_kind(options: DrafterOptions) -> DrafterOptions:
    """``options`` naming a learned kind and the checkpoint to open: a kind's default shipped one, or, for a
    shipped checkpoint's name (e.g. "moa-tli0"), its kind and that checkpoint."""
    if options.name in LEARNED:
        return replace(options, checkpoint=options.checkpoint or LEARNED[options.name])
    if options.name in shipped_names():
        kind = checkpoint_kind(resolve_checkpoint(options.name))
        return replace(options, name=kind, checkpoint=options.checkpoint or options.name)
    raise UnknownDrafterError(f"unknown drafter {options.name!r}; choose one of {', '.join(available_drafters())} "
                              f"(any but ngram also as NAME{LOOKUP_SUFFIX}: prompt lookup merged into its trees)")


def _open_learned(options: DrafterOptions, server_info) -> Drafter:
    """The drafter of kind ``options.name`` ("eagle", "moa", "beagle") from ``options.checkpoint``."""
    from .learned.loading import learned_drafter, open_runtime  # drafter models load only when one is asked for

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
    part = (options.moa_server_part or where.name) if kind == "moa" else ""
    if part and server_info is not None and part not in server_info.moa_server_parts:
        # another part's features would make the drafter guess blindly
        have = ", ".join(server_info.moa_server_parts) or "none"
        raise DrafterCheckpointError(
            f"the server has no MoA server part {part!r} (it has: {have}); start it with "
            f"--moa-server-part {part}" + ("" if part == where.name else "=PATH"))
    target = _target(options, server_info, card)
    runtime = open_runtime(where, target, options.dtype or _learned_dtype(options), options.router,
                           _learned_vocab(options, where, target), _learned_head_dtype(options))
    return learned_drafter(runtime, options.tree, part,
                           LEARNED_CONTEXT_VOCAB if options.context_vocab is None else options.context_vocab)


# A learned drafter drafts over the same list as the independent drafter by default: the 65,536 most frequent
# ids cover ~97-99 % of the target's answers on HumanEval and MT-Bench, where the 8,192 ids counted on the
# first (width-384) drafters' 71k training tokens covered 90 % and 71 % (server/training/README.md), and every id a
# list lacks ends a chain. The committed text's ids come on top.
LEARNED_DRAFT_VOCAB = 65536
LEARNED_CONTEXT_VOCAB = True


def _learned_dtype(options: DrafterOptions):
    """The dtype of a learned drafter's own layers and of MoA's TLI layers when none is asked for: bf16 where the
    device computes it natively, float32 on CPUs that emulate it (several times slower there, shared/device.py).
    Reading weights is most of a drafting level, and the TLI layer is a whole decoder layer of the target: on an
    AVX512-BF16 EPYC a MoA TLI 1 tree took 246 ms in bf16 against 302 with float32 layers (server/training/
    README.md). The heads were trained under bf16 autocast, and their chains do not move."""
    from edgespec.shared.device import default_dtype

    return default_dtype(options.device or "cpu")


def _learned_head_dtype(options: DrafterOptions):
    """The LM head's dtype: with no dtype asked for on a CPU, int8 (``Int8Head``, shared/drafters/target_parts.py:
    a drafting level 1.3-1.7x faster than with bf16 on an AVX512 core, with about bf16's top-1 agreement), else
    the runtime's."""
    import torch

    return torch.int8 if options.dtype is None and options.device in (None, "cpu") else None


def _learned_vocab(options: DrafterOptions, checkpoint, target: str):
    """open_runtime's vocab for these options: --draft-vocab N (0: every id) or the default list; a checkpoint
    with an LM-head router keeps the list its router was trained for unless a list is asked for."""
    from edgespec.shared.drafters.router import router_path

    from .learned.loading import CHECKPOINT_VOCAB

    size = options.draft_vocab
    if size is None:
        if options.router and router_path(find_checkpoint(checkpoint)).is_file():
            return CHECKPOINT_VOCAB
        size = LEARNED_DRAFT_VOCAB
    if size == 0:
        return None
    from transformers import AutoTokenizer

    from edgespec.shared.fingerprint import tokenizer_fingerprint
    from edgespec.shared.models.loading import model_location

    from .independent_vocab import draft_vocab_ids

    tokenizer = AutoTokenizer.from_pretrained(model_location(target))
    return draft_vocab_ids(tokenizer, tokenizer_fingerprint(tokenizer), size, len(tokenizer))


def _target(options: DrafterOptions, server_info, card: dict) -> str:
    """The target whose embedding, norm and LM head a learned drafter reads from this machine's files."""
    if options.target:
        return options.target
    if server_info is not None and server_info.model_name:
        from edgespec.shared.models.loading import model_location

        with contextlib.suppress(Exception):  # the server's model is not on this machine: fall back to the card
            model_location(server_info.model_name)
            return server_info.model_name
    if card.get("target"):
        return card["target"]
    raise DrafterCheckpointError("cannot tell which target's embedding and LM head this drafter uses: "
                                 "pass the target's name or directory (DrafterOptions.target / --target-model)")
