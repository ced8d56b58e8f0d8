"""Model registry, preparation from PyPI GGUF parts, loading, and tiny test models.

Names are resolved lazily so that importing the package (as `edgespec --help`
does, through the `models` subcommand) does not import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {"LoadedModel": "loading", "load_model": "loading", "REGISTRY": "registry", "ModelSpec": "registry",
            "models_home": "registry", "resolve": "registry"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
