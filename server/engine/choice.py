"""Which engine runs a target (``--engine``): the batched one where the architecture, the device and the
KV budget allow it, else the generic one. It sits above both engines (the server's
assembly, ``app``, calls it), so the base module (``base``) names no engine built on it."""
from __future__ import annotations

import logging

from edgespec.server.target import TargetModel

from .base import Engine
from .batched import BatchedEngine, PoolConfig
from .generic import GenericEngine

log = logging.getLogger("edgespec.server")

ENGINES = ("auto", "batched", "generic")
# Architectures whose every layer is full attention over a standard KV cache, so the pool's
# cache can stand in for DynamicCache and a 4-D mask says everything about who sees whom.
BATCHED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "phi3"})


def batched_unsupported(target: TargetModel) -> str | None:
    """Why the batched engine cannot run this target, or None when it can."""
    cfg = target.model.config
    if cfg.model_type not in BATCHED_MODEL_TYPES:
        return f"model type {cfg.model_type!r} is not one of {sorted(BATCHED_MODEL_TYPES)}"
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return "some layers are not full attention (sliding window or hybrid cache)"
    if layer_types is None and getattr(cfg, "sliding_window", None):
        return "the model uses a sliding window"
    attn = getattr(cfg, "_attn_implementation", None)
    if attn not in (None, "sdpa", "eager", "edgespec_pool"):
        return f"attention implementation {attn!r} takes no 4-D additive mask"
    return None


def choose_engine(why_not: str | None, device_type: str, blocks: int, session_blocks: int) -> tuple[str, str]:
    """auto's choice and its reason. blocks: KV blocks the pool's budget holds; session_blocks: what one session at
    the full context needs (the pool must hold one; sessions share it by use, as vLLM's do)."""
    if why_not:
        return "generic", why_not
    if device_type == "cpu":
        return "generic", "CPU device"
    if blocks < session_blocks:
        return "generic", (f"the KV budget holds {blocks} blocks, fewer than one session at the full context needs "
                           f"({session_blocks}); a higher --gpu-memory-utilization or a lower --max-model-len lets "
                           f"the batched engine run")
    return "batched", f"{device_type} device, paged KV of {blocks} blocks"


def build_engine(target: TargetModel, kind: str = "auto", pool=None) -> Engine:
    """The engine for `kind` ("auto", "batched", "generic"); pool: a ``PoolConfig`` for the batched one.

    auto: batched on an accelerator when the architecture allows it (its paged KV serves every context
    length: sessions take blocks as they grow); generic otherwise, and on a CPU, where one session's
    verification runs a little slower on the pool (the server bench measures both).
    """
    if kind not in ENGINES:
        raise ValueError(f"unknown engine {kind!r}; choose one of {ENGINES}")
    pool = pool or PoolConfig()
    why_not = batched_unsupported(target)
    if kind == "batched" and why_not:
        raise ValueError(f"--engine batched cannot run {target.name}: {why_not}; use --engine generic")
    reason = "asked for"
    if kind == "auto":
        blocks, _ = BatchedEngine.blocks_that_fit(target, pool)
        resolved = pool.resolved(target.device.type)
        kind, reason = choose_engine(why_not, target.device.type, blocks, resolved.session_tokens // resolved.block_size)
    engine: Engine = GenericEngine(target) if kind == "generic" else BatchedEngine(target, pool)
    log.info("engine: %s (%s)", engine.describe(), reason)
    return engine
