"""GenericEngine: one forward per item on the item's own transformers ``DynamicCache``, with a 4-D mask for
a tree. Any architecture Hugging Face runs; the CPU default (``choice.build_engine``)."""
from __future__ import annotations

import time
from typing import Sequence

import torch

from edgespec.shared.kv import DynamicKV, SessionKV

from .base import Engine, ForwardOutput, Work
from .masks import batch_attention_mask


class GenericEngine(Engine):
    """One forward per item on the item's own DynamicCache: any architecture, no padding."""

    name = "generic"

    def new_kv(self) -> DynamicKV:
        return DynamicKV(self.target.model.config)

    def run(self, items: Sequence[tuple[SessionKV, Work]]) -> list[ForwardOutput]:
        return [self._one(kv, work) for kv, work in items]

    @torch.inference_mode()
    def _one(self, kv: DynamicKV, work: Work) -> ForwardOutput:
        t0 = time.perf_counter_ns()
        target, past, n, times = self.target, len(kv), len(work), self.times
        dev = target.device
        ids = torch.tensor([work.ids], dtype=torch.long, device=dev)  # [1, T]
        positions = torch.tensor([work.positions], dtype=torch.long, device=dev)  # [1, T]
        mask = None  # a causal chunk: transformers builds its own (and skips it when it can)
        if not work.causal:
            parents = torch.tensor([work.parents], dtype=torch.long, device=dev)
            mask = batch_attention_mask(parents, positions, torch.tensor([past], device=dev),
                                        torch.tensor([n], device=dev), past + n, target.dtype)
        t1 = time.perf_counter_ns()
        try:
            hidden = target.decode(ids, positions, mask, kv.cache)[0]  # [T, E]
        except BaseException:
            kv.crop(past)  # a failed pass must not leave half its rows in some layers
            raise
        logits = target.logits(hidden[work.logits_from:])
        t2 = time.perf_counter_ns()  # on a GPU the forward is still running: its time shows up in the reader's
        times.steps, times.pack_ns, times.launch_ns = times.steps + 1, times.pack_ns + t1 - t0, times.launch_ns + t2 - t1
        times.device_ns += t2 - t1  # the generic engine has no readback of its own to time the device against
        return ForwardOutput(hidden, logits, t2 - t0)
