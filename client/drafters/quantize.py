"""A drafter's model with low-bit Linear layers in place of its float ones: int8 everywhere (``int8_linear``),
or int4 inside the modules of a name (``int4_linear``; the independent drafter's MLP)."""
from __future__ import annotations

import torch

from .int4_linear import Int4Linear, fits_int4
from .int8_linear import Int8Linear


def quantize_linears(module: torch.nn.Module, keep_float: bool = False, int4_under: str | None = None,
                     prefix: str = "") -> int:
    """Replace every nn.Linear under module (in place) by an Int8Linear, keeping the float weights for
    calls of many rows when asked; returns how many. With ``int4_under`` (a module name such as "mlp"), the
    layers inside a module of that name become Int4Linear instead, where their shape fits the int4 kernel."""
    count = 0
    for name, child in list(module.named_children()):
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(child, torch.nn.Linear):
            if int4_under and int4_under in path.split(".")[:-1] and fits_int4(child.weight):
                setattr(module, name, Int4Linear.from_weight(child.weight, child.bias, keep_float=keep_float))
            else:
                setattr(module, name, Int8Linear.from_weight(child.weight, child.bias, keep_float))
            count += 1
        else:
            count += quantize_linears(child, keep_float, int4_under, path)
    return count
