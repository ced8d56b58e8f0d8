"""Load a model and its tokenizer by registry name, local directory or hub id."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from edgespec.shared.device import parse_dtype, pick_device
from edgespec.shared.errors import ModelPrepareError
from edgespec.shared.fingerprint import tokenizer_fingerprint
from .prepare import is_prepared
from .registry import HubId, LocalDir, PypiGguf, resolve, prepared_dir


@dataclass
class LoadedModel:
    name: str
    model: "torch.nn.Module"  # a transformers *ForCausalLM, in eval mode
    tokenizer: object  # a transformers tokenizer
    device: torch.device
    dtype: torch.dtype
    fingerprint: str  # tokenizer_fingerprint(tokenizer)


def model_location(name_or_path: str) -> str:
    """What from_pretrained should read for this name."""
    spec = resolve(name_or_path)
    if isinstance(spec.source, PypiGguf):
        if not is_prepared(spec.name):
            raise ModelPrepareError(f"model {spec.name} is not prepared yet: run `edgespec models prepare {spec.name}`")
        return str(prepared_dir(spec.name))
    if isinstance(spec.source, LocalDir):
        return str(spec.source.path)
    assert isinstance(spec.source, HubId)
    return spec.source.repo_id


@contextlib.contextmanager
def hub_errors(name_or_path: str) -> Iterator[None]:
    """Around a from_pretrained of a Hugging Face hub id (transformers fetches it with huggingface_hub): a
    failure to get it becomes one ModelPrepareError that names the ways to a model without the hub."""
    try:
        yield
    except OSError as err:
        spec = resolve(name_or_path)
        if not isinstance(spec.source, HubId):
            raise
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelPrepareError(
            f"model {spec.source.repo_id!r} is neither a registry name nor a folder here, and the Hugging Face hub "
            f"did not give it ({reason}). Without the hub: download it where the hub is reachable "
            f"(`huggingface-cli download {spec.source.repo_id} --local-dir DIR`), copy DIR to this machine and "
            f"give its path; or use a registry model, which comes from PyPI (`edgespec models list`)") from None


def load_model(name_or_path: str, device: str | None = None, dtype: str | torch.dtype | None = None,
               trust_remote_code: bool = False) -> LoadedModel:
    """Model + tokenizer on `device` (default: CUDA if present, else CPU) in `dtype` (None or "auto":
    ``default_dtype(device)``, bf16 where the hardware computes it natively, else float32;
    "checkpoint": the checkpoint's own dtype, as its config records it).

    trust_remote_code lets a model repository run its own modelling code; off unless asked for,
    as in transformers.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = model_location(name_or_path)
    dev = pick_device(device)
    if isinstance(dtype, str) and dtype.lower() == "auto":
        dtype = None
    with hub_errors(name_or_path):
        if isinstance(dtype, str) and dtype.lower() == "checkpoint":
            config = AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code)
            dt = checkpoint_dtype(config)
        else:
            dt = parse_dtype(dtype, dev)
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dt, trust_remote_code=trust_remote_code)
    model = model.to(dev).eval()
    name = resolve(name_or_path).name if not Path(name_or_path).is_dir() else Path(where).name
    return LoadedModel(name, model, tokenizer, dev, dt, tokenizer_fingerprint(tokenizer))


def checkpoint_dtype(config) -> torch.dtype:
    """The dtype a checkpoint's config records (``dtype``, formerly ``torch_dtype``); float32 when it records none,
    which is what transformers itself assumes."""
    recorded = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(recorded, torch.dtype):
        return recorded
    if isinstance(recorded, str):
        return getattr(torch, recorded.removeprefix("torch."))
    return torch.float32
