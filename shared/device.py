"""Device and dtype choice: CUDA when present, else CPU; bf16 by default."""
from __future__ import annotations

import torch

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
           "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}


def pick_device(requested: str | None = None) -> torch.device:
    """The requested device, or cuda:0 when CUDA is available, else cpu."""
    if requested and requested != "auto":
        dev = torch.device(requested)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {requested!r} was asked for but CUDA is not available on this machine")
        return dev
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype:
    """'bfloat16' / 'bf16' / 'float16' / 'float32' (or a torch.dtype) -> torch.dtype; None -> bfloat16."""
    if name is None:
        return torch.bfloat16
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}") from None
