"""How much memory the batched engine's KV pool gets.

On a GPU the pool takes what ``--gpu-memory-utilization`` leaves (vLLM's name and meaning): that share of
the device's memory, less what the process already holds (the weights, loaded before the pool), less
the step's workspace. vLLM measures that workspace with a profiling run; here it is estimated from the
largest bucket: the float32 logits of every row it may run the LM head on (the biggest buffer a step
holds), the step's activations (a few hidden-size and MLP-size rows a row), and a fixed margin for CUDA
graphs, cuBLAS workspaces and the allocator's slack. Elsewhere (a CPU) the pool is ``--max-kv-gb``.
"""
from __future__ import annotations

import torch

from edgespec.server.target import TargetModel

GRAPH_MARGIN = 2 << 30  # CUDA graphs' private pools, cuBLAS workspaces, fragmentation


def step_workspace_bytes(target: TargetModel, max_rows: int) -> int:
    """An estimate of the step's peak memory beyond the weights and the pool, at `max_rows` rows."""
    cfg = target.model.config
    inter = int(getattr(cfg, "intermediate_size", 4 * target.hidden_size))
    width = torch.empty((), dtype=target.dtype).element_size()
    logits = max_rows * target.vocab_size * (4 + width)  # the head's output and its float32 copy
    activations = max_rows * (8 * target.hidden_size + 3 * inter) * width
    return logits + activations


def kv_pool_bytes(target: TargetModel, gpu_memory_utilization: float, max_kv_bytes: int, max_rows: int) -> int:
    """The pool's budget: on CUDA from the utilization share (see the module's docstring), else max_kv_bytes."""
    if target.device.type != "cuda":
        return max_kv_bytes
    free, total = torch.cuda.mem_get_info(target.device)
    held = total - free  # the weights and whatever else this process (or another) holds already
    budget = int(total * gpu_memory_utilization) - held - step_workspace_bytes(target, max_rows) - GRAPH_MARGIN
    return max(0, budget)
