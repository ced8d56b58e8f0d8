"""How the device step runs: eagerly, compiled, or replayed from a CUDA graph captured per bucket.

- ``EagerRunner``: the step as Python calls it (a CPU's path: there is no launch
  overhead to save, and shapes follow the batch exactly).
- ``CompiledRunner``: ``torch.compile(fullgraph=True, dynamic=False)`` of the
  step's two bucket parts (``DeviceStep.decode``, ``DeviceStep.finish``), one
  graph each per bucket (tests prove graph readiness with it on a CPU).
- ``GraphRunner``: on CUDA, a pair of ``torch.cuda.CUDAGraph`` per bucket of a
  grid (the decoder; acceptance and compaction), captured at start into one
  shared memory pool (the graphs never run at once), largest first as vLLM
  does; a batch of a captured bucket is a copy into the bucket's static input,
  a replay, the LM head at the batch's own head rows, a replay. Other shapes
  run eagerly.

The LM head runs between the two graphs, uncaptured, so that it computes the
rows whose logits are used and no others (padding rows, prompt rows): a
captured head would need the head-row count as one more bucket dimension.
It is three kernels (the matmul, the float32 copy, the argmax), so launching
them costs about what a third graph's replay would.

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
from typing import Iterable, NamedTuple

import torch

from .step import Bucket, DeviceStep, StepOutput, padding_batch

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
    """torch.compile of the step's two bucket parts, one graph each per bucket (``backend``: "inductor",
    "aot_eager", ...); the LM head between them runs as it is, at the batch's own head rows (compiled, every
    head-row count would be a graph of its own)."""

    kind = "compiled"

    def __init__(self, step: DeviceStep, backend: str = "inductor", max_buckets: int = 256):
        super().__init__(step)
        self.max_buckets = max_buckets
        self._threads_raised: set[int] = set()
        self.raise_limits()
        self.decode = torch.compile(step.decode, backend=backend, fullgraph=True, dynamic=False)
        self.finish = torch.compile(step.finish, backend=backend, fullgraph=True, dynamic=False)

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
        packed = upload(flat, self.step.target.device)
        inputs = packed[:bucket.packed]  # the bucket's shape: the head rows after it vary with the batch
        hidden, sees = self.decode(inputs, bucket)
        logits, best = self.step.head(hidden, packed[bucket.packed:])
        return StepOutput(hidden, logits, self.finish(inputs, bucket, sees, best))


class Captured(NamedTuple):
    """One bucket's two graphs and the static tensors they read and write."""

    decode: torch.cuda.CUDAGraph
    finish: torch.cuda.CUDAGraph
    static: torch.Tensor  # [bucket.packed + N] long: the packed input, room for the head rows after it
    hidden: torch.Tensor  # decode's outputs
    sees: torch.Tensor
    best: torch.Tensor  # [N] long: the head's argmax, finish's input
    readback: torch.Tensor  # finish's output


class GraphRunner(EagerRunner):
    """CUDA graphs, two per bucket (the decoder; acceptance and compaction), captured at construction; the LM
    head runs between their replays at the batch's own head rows."""

    kind = "cuda-graphs"

    def __init__(self, step: DeviceStep, buckets: Iterable[Bucket]):
        super().__init__(step)
        self.graphs: dict[Bucket, Captured] = {}
        self.capture_s = 0.0
        self._pool = None
        buckets = sorted(buckets, key=lambda b: (b.rows, b.keys), reverse=True)
        t0 = time.perf_counter()
        for bucket in buckets:
            self.graphs[bucket] = self._capture(bucket)
        self.capture_s = time.perf_counter() - t0
        log.info("captured %d CUDA graph pairs in %.1f s: rows %s x keys %s", len(self.graphs), self.capture_s,
                 *(sorted({getattr(b, f) for b in self.graphs}) for f in ("rows", "keys")))

    @torch.no_grad()
    def _capture(self, bucket: Bucket) -> Captured:
        step, device = self.step, self.step.target.device
        # a batch of padding only: it reads and writes the scratch block, never a session's
        static = torch.tensor(padding_batch(bucket, step.pool.scratch) + [0] * bucket.rows, dtype=torch.long,
                              device=device)
        inputs = static[:bucket.packed]
        best = torch.full((bucket.rows,), -1, dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS workspaces, lazy inits)
            for _ in range(2):
                _, sees = step.decode(inputs, bucket)
                step.finish(inputs, bucket, sees, best)
        torch.cuda.current_stream(device).wait_stream(side)
        decode = torch.cuda.CUDAGraph()
        with torch.cuda.graph(decode, pool=self._pool):
            hidden, sees = step.decode(inputs, bucket)
        self._pool = decode.pool()  # one pool for every graph: they never run at once
        finish = torch.cuda.CUDAGraph()
        with torch.cuda.graph(finish, pool=self._pool):
            readback = step.finish(inputs, bucket, sees, best)
        return Captured(decode, finish, static, hidden, sees, best, readback)

    def __call__(self, flat: list[int], bucket: Bucket) -> StepOutput:
        captured = self.graphs.get(bucket)
        if captured is None:
            return super().__call__(flat, bucket)
        c = captured
        c.static[:len(flat)].copy_(torch.tensor(flat, dtype=torch.long).pin_memory(), non_blocking=True)
        c.decode.replay()
        logits, _ = self.step.head(c.hidden, c.static[bucket.packed:len(flat)], c.best)
        c.finish.replay()
        return StepOutput(c.hidden, logits, c.readback)  # static buffers: valid until the next step
