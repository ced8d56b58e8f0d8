"""Model registry, preparation from PyPI GGUF parts, loading, and tiny test models."""
from .loading import LoadedModel, load_model
from .registry import REGISTRY, ModelSpec, models_home, resolve

__all__ = ["LoadedModel", "load_model", "REGISTRY", "ModelSpec", "models_home", "resolve"]
