"""How the device step runs: eagerly, compiled, or replayed from a CUDA graph captured per bucket.

- ``EagerRunner``: the step as Python calls it (a CPU's path: there is no launch
  overhead to save, and shapes follow the batch exactly).
- ``CompiledRunner``: ``torch.compile(fullgraph=True, dynamic=False)`` of the
  step, one graph per bucket (tests prove graph readiness with it on a CPU).
- ``GraphRunner``: on CUDA, one ``torch.cuda.CUDAGraph`` per bucket of a grid,
  captured at start into one shared memory pool (the graphs never run at once),
  largest first as vLLM does; a batch of a captured bucket is a copy into the
  bucket's static input and one replay. Other shapes (long prefill chunks) run
  eagerly.

Why graphs by hand rather than ``torch.compile(mode="reduce-overhead")``: the
grid holds a couple of hundred buckets and Inductor compiles each shape anew
(tens of seconds a shape for a 1.5B-7B decoder), so start-up would take an
hour; a hand capture costs two eager runs a bucket. The step already writes the
KV pool in place at fixed addresses (block tables are inputs), which a captured graph replays as is,
while cudagraph trees skip graphs that mutate inputs they do not own. What the
hand capture gives up is Inductor's kernel fusion (the mask's and norms'
elementwise ops), not the launch overhead the review measured (10-14 ms of host
time per step against 3-7 ms of GPU work).

The upload: the host packs a batch in one long tensor, pinned on CUDA, and
copies it without blocking; the readback of the step's result (the batch's
one synchronisation) comes after the replay, so a pinned block is never
rewritten while its copy is in flight (the caching host allocator also records
the copy's stream).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Iterable

import torch

from .engine_step import Bucket, DeviceStep, StepOutput, padding_rows

log = logging.getLogger("edgespec.server")


def upload(flat: list[int], device: torch.device) -> torch.Tensor:
    """The batch's one host-to-device copy: a long tensor built on the host (pinned on CUDA), sent
    without blocking the host."""
    host = torch.tensor(flat, dtype=torch.long)
    if device.type != "cuda":
        return host if device.type == "cpu" else host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class EagerRunner:
    kind = "eager"

    def __init__(self, step: DeviceStep):
        self.step = step

    def __call__(self, flat: list[int], bucket: Bucket) -> StepOutput:
        return self.step(upload(flat, self.step.target.device), bucket)


class CompiledRunner(EagerRunner):
    """torch.compile of the step, one graph per bucket (``backend``: "inductor", "aot_eager", ...)."""

    kind = "compiled"

    def __init__(self, step: DeviceStep, backend: str = "inductor", max_buckets: int = 256):
        super().__init__(step)
        self.max_buckets = max_buckets
        self._threads_raised: set[int] = set()
        self.raise_limits()
        self.compiled = torch.compile(step.__call__, backend=backend, fullgraph=True, dynamic=False)

    def raise_limits(self) -> None:
        """Every bucket is its own graph: dynamo must not give up (a hard error under fullgraph) after 8 shapes.
        Dynamo's settings are per thread, and the scheduler's thread compiles, so each calling thread raises
        them for itself once (a value set where the runner was built is not seen there)."""
        import torch._dynamo

        cfg = torch._dynamo.config
        for name in ("recompile_limit", "accumulated_recompile_limit"):  # cache_size_limit in older releases
            old_name = name.replace("recompile_limit", "cache_size_limit")
            name = name if hasattr(cfg, name) else old_name
            setattr(cfg, name, max(getattr(cfg, name), self.max_buckets))
        self._threads_raised.add(threading.get_ident())

    def __call__(self, flat: list[int], bucket: Bucket) -> StepOutput:
        if threading.get_ident() not in self._threads_raised:
            self.raise_limits()
        return self.compiled(upload(flat, self.step.target.device), bucket)


class GraphRunner(EagerRunner):
    """CUDA graphs, one per bucket, captured at construction."""

    kind = "cuda-graphs"

    def __init__(self, step: DeviceStep, buckets: Iterable[Bucket]):
        super().__init__(step)
        self.graphs: dict[Bucket, tuple[torch.cuda.CUDAGraph, torch.Tensor, StepOutput]] = {}
        self.capture_s = 0.0
        self._pool = None
        buckets = sorted(buckets, key=lambda b: (b.batch * b.tokens, b.keys), reverse=True)
        # Every graph's outputs stay allocated (they are read after its replay), so the big one, the logits
        # [R, V] float32, goes to one buffer all graphs write into: one graph's would be 1.2 GB at 2,048 rows
        # of a 152k vocabulary, and a grid holds a couple of hundred graphs. hidden [B, T, E] stays per graph.
        target = step.target
        self.logits = torch.empty(max((b.head for b in buckets), default=0), target.vocab_size, dtype=torch.float32,
                                  device=target.device)
        t0 = time.perf_counter()
        for bucket in buckets:
            self.graphs[bucket] = self._capture(bucket)
        self.capture_s = time.perf_counter() - t0
        log.info("captured %d CUDA graphs in %.1f s: batch %s x tokens %s x keys %s", len(self.graphs),
                 self.capture_s, *(sorted({getattr(b, f) for b in self.graphs}) for f in ("batch", "tokens", "keys")))

    @torch.no_grad()
    def _capture(self, bucket: Bucket) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, StepOutput]:
        step, device = self.step, self.step.target.device
        # a batch of padding only: it reads and writes the scratch block, never a session's
        rows = bucket.batch * bucket.tokens
        flat = padding_rows(bucket, step.pool.scratch) * bucket.batch
        static = torch.tensor(flat + [i % rows for i in range(bucket.head)], dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS workspaces, lazy inits)
            for _ in range(2):
                step(static, bucket, logits_out=self.logits[:bucket.head])
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = step(static, bucket, logits_out=self.logits[:bucket.head])
        self._pool = graph.pool()  # one pool for every graph: they never run at once
        return graph, static, out

    def __call__(self, flat: list[int], bucket: Bucket) -> StepOutput:
        captured = self.graphs.get(bucket)
        if captured is None:
            return super().__call__(flat, bucket)
        graph, static, out = captured
        static.copy_(torch.tensor(flat, dtype=torch.long).pin_memory(), non_blocking=True)
        graph.replay()
        return out  # static buffers: valid until the next step
