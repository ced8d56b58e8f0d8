"""KV bookkeeping shared by the server's target and the client's independent drafter.

A session's KV holds, per layer, keys and values of the tokens fed so far. Every
speculative-decoding loop needs to ``crop`` it (a rejected tree, a rollback), to
``keep_rows`` (the past plus a tree's accepted path, in order), to read its
``layer_kv`` (MoA's Layer Self-Attention input) and to count its bytes (memory caps).

Two stores implement them: a transformers ``DynamicCache`` (``DynamicKV``, the
generic path, one growing tensor per layer) and blocks of the server's paged
pool (``edgespec.server.engine.kv.PagedKV``). Both keep rows by gathering them,
then writing them back behind the past, so the pool is never reallocated.

And the name under which a Hugging Face module takes and returns its cache: transformers 5.24 renamed
``past_key_values`` to ``cache`` (the old name warns on every forward and is removed in 5.40); earlier releases
know only the old name. It is read off the module's own signature, once per class, so one code path works on
every release the project declares.
"""
from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch


# ------------------------------------------------------------------ tensor level
@torch.inference_mode()
def keep_rows_of(t: torch.Tensor, past_len: int, rows: Sequence[int]) -> torch.Tensor:
    """t: [..., S, D]. Make positions past_len.. hold the given rows (offsets from past_len), in order.

    Returns the tensor to use from now on: a view of t itself when the rows are a prefix
    (nothing moves), else t with the rows copied into place (in place, so the storage stays
    where it is). Positions after past_len + len(rows) are left as they were: callers track the
    length apart.
    """
    rows = list(rows)
    if rows == list(range(len(rows))):
        return t
    index = torch.tensor([past_len + r for r in rows], dtype=torch.long, device=t.device)
    picked = t.index_select(-2, index)  # [..., n, D], a copy: sources and destinations may overlap
    t[..., past_len:past_len + len(rows), :] = picked
    return t


def rows_kv(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], start: int, end: int) -> torch.Tensor:
    """Per-token K|V of every layer for positions [start, end): [T, L, 2*E_kv] (keys after RoPE).

    keys, values: one [H_kv, S, D] tensor per layer.
    """
    out = []
    for k, v in zip(keys, values):
        k, v = k[:, start:end], v[:, start:end]  # [H_kv, T, D]
        h, t, d = k.shape
        out.append(torch.cat([k.transpose(0, 1).reshape(t, h * d), v.transpose(0, 1).reshape(t, h * d)], dim=-1))
    return torch.stack(out, dim=1)


# ------------------------------------------------------------ DynamicCache level
def _filled(cache) -> list:
    return [layer for layer in cache.layers if getattr(layer, "keys", None) is not None and layer.keys.numel()]


def cache_len(cache) -> int:
    return int(cache.get_seq_length())


def crop(cache, length: int) -> None:
    """Keep the first `length` tokens of a DynamicCache.

    Sliced here rather than with ``DynamicCache.crop``, whose argument changed meaning across
    transformers versions (absolute length, then tokens to remove).
    """
    for layer in _filled(cache):
        if layer.keys.shape[-2] > length:
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def keep_rows(cache, past_len: int, rows: Sequence[int]) -> None:
    """Keep the first past_len tokens of a DynamicCache plus the given rows after them, in order."""
    for layer in _filled(cache):
        # keys/values: [B, H_kv, S, D], the cache's own tensors: rows move in place
        layer.keys = keep_rows_of(layer.keys, past_len, rows)
        layer.values = keep_rows_of(layer.values, past_len, rows)
    crop(cache, past_len + len(rows))


def layer_kv(cache, start: int, end: int) -> torch.Tensor:
    """Per-token K|V of every layer of a DynamicCache for tokens [start, end): [T, L, 2*E_kv]."""
    layers = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
    return rows_kv([layer.keys[0] for layer in layers], [layer.values[0] for layer in layers], start, end)


# ----------------------------------------------------- the cache's argument name
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


# ------------------------------------------------------------------- one session
class SessionKV(ABC):
    """One session's KV, whichever store holds it. Not thread-safe: one user at a time."""

    @abstractmethod
    def __len__(self) -> int:
        """Tokens held."""

    @abstractmethod
    def crop(self, length: int) -> None:
        """Keep the first `length` tokens."""

    @abstractmethod
    def keep_rows(self, past_len: int, rows: Sequence[int]) -> None:
        """Keep the first past_len tokens plus the given rows after them (offsets from past_len), in order."""

    @abstractmethod
    def layer_kv(self, start: int, end: int) -> torch.Tensor:
        """Per-token K|V of every layer for tokens [start, end): [T, L, 2*E_kv], a tensor of its own."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Memory this session holds (what memory caps count)."""

    def reserve(self) -> None:
        """Take what the next forward needs now, on the caller's thread, not the model's (a paged pool takes
        blocks as a session grows instead, before its work joins a batch)."""

    def close(self) -> None:
        """Give the memory back now rather than when the object is collected."""


class DynamicKV(SessionKV):
    """A transformers DynamicCache: grows by concatenation, freed with the object."""

    def __init__(self, config=None):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=config) if config is not None else DynamicCache()

    def __len__(self) -> int:
        return cache_len(self.cache)

    def crop(self, length: int) -> None:
        crop(self.cache, length)

    def keep_rows(self, past_len: int, rows: Sequence[int]) -> None:
        keep_rows(self.cache, past_len, rows)

    def layer_kv(self, start: int, end: int) -> torch.Tensor:
        return layer_kv(self.cache, start, end).clone()

    @property
    def nbytes(self) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in _filled(self.cache))

    def close(self) -> None:
        self.crop(0)
