"""A learned drafter's runtime (EAGLE, MoA, Beagle) from its checkpoint and the target's own frozen parts:
embedding, final norm and LM head (and, for MoA with TLI = N, its last N layers), which ``open_runtime`` takes
from a loaded target or reads from its files. A drafter made for another target would produce garbage rather
than an error, so its shapes are checked here. Which drafter, checkpoint and target a name means is the
factory's business (``factory.make_drafter``).
"""
from __future__ import annotations

from pathlib import Path

import torch

from edgespec.client.drafters.tree_builder import TreeShape
from edgespec.shared.drafters.beagle.model import load_beagle
from edgespec.shared.drafters.checkpoint import DrafterCheckpointError, checkpoint_kind, find_checkpoint
from edgespec.shared.drafters.eagle.model import load_eagle
from edgespec.shared.drafters.moa.client_part import load_moa_client
from edgespec.shared.drafters.router import attach_router_if_present
from edgespec.shared.drafters.target_parts import TargetParts, load_target_parts
from edgespec.shared.session_settings import FeatureRequest
from edgespec.shared.wire import FeatureKind

from .beagle_runtime import BeagleRuntime
from .drafter import LearnedDrafter
from .eagle_runtime import EagleRuntime
from .moa_runtime import MoARuntime
from .runtime import LearnedRuntime


CHECKPOINT_VOCAB = "checkpoint"  # open_runtime's vocab: the list the drafter was trained over


def open_runtime(path: str | Path, target, dtype: torch.dtype | str | None = None,
                 router: bool = True, vocab: torch.Tensor | str | None = CHECKPOINT_VOCAB,
                 head_dtype: torch.dtype | None = None) -> LearnedRuntime:
    """The drafting runtime of the checkpoint at ``path`` (see ``find_checkpoint``). ``target``: a loaded
    *ForCausalLM, or its registry name / folder: then only the parts the drafter needs are read from its
    files. ``dtype``: None is float32, which a laptop CPU without bf16 units runs the drafter's small
    matmuls fastest in (the client's factory asks for bf16 where the CPU has them). A ``router.safetensors``
    beside the drafter (CORAL's LM-head router) is attached unless ``router`` is False; its groups cut the
    checkpoint's own list, so it is only used with that list.

    ``vocab``: the draft vocabulary. The drafters have no weights per vocabulary row (their logits are the
    target's LM head over a predicted state), so any list works: ``CHECKPOINT_VOCAB`` the one the checkpoint
    was trained over, a tensor of target ids, or None for every id. ``head_dtype``: the LM head's (None:
    ``dtype``), which is most of a drafting step's time."""
    ckpt = find_checkpoint(path)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype or torch.float32
    runtime = _open(ckpt, target, dtype, vocab, head_dtype)
    attach_router_if_present(runtime, ckpt, enabled=router and isinstance(vocab, str) and vocab == CHECKPOINT_VOCAB)
    return runtime


def _vocab(trained: torch.Tensor | None, asked: torch.Tensor | str | None) -> torch.Tensor | None:
    if isinstance(asked, str):
        if asked != CHECKPOINT_VOCAB:
            raise ValueError(f"vocab must be {CHECKPOINT_VOCAB!r}, a tensor of target ids or None, got {asked!r}")
        return trained
    return None if asked is None else torch.as_tensor(asked, dtype=torch.long).unique()


def _open(ckpt: Path, target, dtype: torch.dtype, vocab: torch.Tensor | str | None,
          head_dtype: torch.dtype | None = None) -> LearnedRuntime:
    if ckpt.is_file():
        beagle = checkpoint_kind(ckpt) == "beagle"
        head, vocab_ids = (load_beagle if beagle else load_eagle)(ckpt)
        parts = _parts(target, 0, _vocab(vocab_ids, vocab), dtype, head_dtype)
        _check_fits(ckpt, parts, hidden_size=head.config.hidden_size)
        return (BeagleRuntime if beagle else EagleRuntime)(head.to(dtype), parts)
    client, vocab_ids = load_moa_client(ckpt)
    parts = _parts(target, client.config.tli, _vocab(vocab_ids, vocab), dtype, head_dtype)
    c = client.config
    _check_fits(ckpt, parts, hidden_size=c.hidden_size, num_layers=c.num_layers, kv_size=c.kv_size)
    return MoARuntime(client.to(dtype), parts)


def _parts(target, tli: int, vocab_ids: torch.Tensor | None, dtype: torch.dtype,
           head_dtype: torch.dtype | None = None) -> TargetParts:
    if isinstance(target, (str, Path)):
        return load_target_parts(str(target), tli, vocab_ids, dtype, head_dtype)
    return TargetParts(target, tli, vocab_ids, dtype, head_dtype)


def _check_fits(ckpt: Path, parts: TargetParts, **trained: int) -> None:
    actual = {k: getattr(parts.shape, k) for k in trained}
    if trained != actual:
        raise DrafterCheckpointError(f"{ckpt} was trained for a target with {trained}, this target has {actual}")


def learned_drafter(runtime: LearnedRuntime, tree: TreeShape, moa_server_part: str = "",
                    context_vocab: bool = True) -> LearnedDrafter:
    """The client's ``Drafter`` over a runtime; MoA's features come from the server part ``moa_server_part``;
    ``context_vocab``: with a reduced list, the committed text's ids are drafted too."""
    if isinstance(runtime, MoARuntime):
        tli = runtime.parts.tli
        return LearnedDrafter(f"moa-tli{tli}", runtime, FeatureRequest(FeatureKind.MOA, moa_server_part, tli), tree,
                              context_vocab)
    return LearnedDrafter(runtime.name.lower(), runtime, FeatureRequest(FeatureKind.LAST_HIDDEN), tree, context_vocab)
