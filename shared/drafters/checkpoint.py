"""Drafter checkpoint files: safetensors with the config (JSON) in the metadata.

Checkpoints hold only the drafter's own weights (+ the reduced-vocabulary map):
the target's embedding, norm, LM head and TLI layers come from the target's
files on the client. Weights are stored in a compact dtype (bf16 by default) to
keep a shipped drafter small.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, TypeVar

import torch

from ..errors import EdgespecError

M = TypeVar("M", bound=torch.nn.Module)


class DrafterCheckpointError(EdgespecError, ValueError, grpc_code="FAILED_PRECONDITION"):
    """A drafter checkpoint that is missing, of another kind, or does not fit its target."""


def save_weights(path: str | Path, kind: str, config: dict, state: dict[str, torch.Tensor],
                 vocab_ids: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16) -> Path:
    from safetensors.torch import save_file

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
    from safetensors import safe_open
    from safetensors.torch import load_file

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
