"""Data-parallel training across processes: what ``torchrun`` (or ``accelerate launch``) sets up.

A launcher starts N copies of ``edgespec train fit`` with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT in the environment; ``init`` joins them into one process group
(NCCL when each process has a GPU, gloo on CPUs) and gives each its device. Every rank holds
the same drafter; after the backward passes of a step their gradients are summed
(``all_reduce_grads``, one flat buffer per step: a drafter's few million parameters are one
message) so each rank takes the same optimizer step. Without a launcher: one process, no group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int  # this process (0 = the one that logs, validates and writes files)
    size: int  # processes in all
    device: torch.device  # where this process trains

    @property
    def main(self) -> bool:
        return self.rank == 0


def init(device: str | torch.device | None = None) -> World:
    """Join the launcher's process group, if there is one (idempotent)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World(0, 1, torch.device(device or "cpu"))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    want = torch.device(device) if device is not None else None
    cuda = torch.cuda.is_available() and (want is None or want.type == "cuda")
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=size)
    return World(rank, size, dev)


def all_reduce_grads(params: list[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks (a missing gradient counts as zeros)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def all_sum(values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of a float tensor over the ranks (the tensor itself when alone)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        values = values.clone()
        dist.all_reduce(values)
    return values


def broadcast_params(params: list[torch.nn.Parameter]) -> None:
    """Every rank starts from rank 0's weights (seeded inits agree anyway; this makes sure)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, 0)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
