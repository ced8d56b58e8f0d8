"""The name under which a Hugging Face module takes and returns its KV cache.

transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns on
every forward and is removed in 5.40); earlier releases know only the old name.
The name is read off the module's own signature, once per class, so one code path
works on every release the project declares.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


@functools.lru_cache(maxsize=None)
def _cache_kwarg_of(cls: type) -> str:
    # deprecate_kwarg wraps with functools.wraps, so the signature is the real forward's.
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(module: torch.nn.Module) -> str:
    """``"cache"`` where ``module.forward`` takes it, else ``"past_key_values"``."""
    return _cache_kwarg_of(type(module))


def with_cache(module: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword arguments that hand ``cache`` to ``module`` (for ``module(**..., **with_cache(m, c))``)."""
    return {cache_kwarg(module): cache}


def output_cache(out: Any) -> Any:
    """The cache a forward returned, read without touching the deprecated ``past_key_values`` property."""
    return out.cache if "cache" in getattr(out, "__dataclass_fields__", {}) else out.past_key_values
