"""ModelScheduler: the one place the target's forward passes run.

One worker thread owns the model. Callers (a session's stream, a plain-API
request) hand it work and wait:

- ``forward(kv, work)``: tokens for one session's KV. The worker gathers every
  forward waiting in the queue into one batch for the engine, oldest first,
  under a token budget, so no caller waits more than one batch behind a newer
  one. Prompts go in chunks (``prefill``), each chunk queued behind the work
  that arrived meanwhile, so a long prompt cannot stall the other sessions.
- ``run(fn)``: any other job that needs the model alone, in arrival order.

What a caller does with its rows (acceptance, keeping the accepted KV) runs on
the caller's thread: it touches only its own session's KV, which no other
batch reads. The wait in the queue is reported as ``queue_ns`` in the wire's
Timings.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import torch

from edgespec.shared.kv import SessionKV
from edgespec.shared.tree import DraftTree

from .engine import Engine, ForwardOutput, Work

T = TypeVar("T")


@dataclass(frozen=True)
class SchedulerConfig:
    """How forwards are batched."""

    max_batch_tokens: int = 2048  # tokens one forward computes (padding included); the oldest item always runs
    max_batch_items: int = 64  # sessions in one forward
    prefill_chunk: int = 512  # a prompt goes in chunks of this many tokens, each queued behind newer work


@dataclass
class SchedulerStats:
    """What the worker did: the server bench's device time comes from here."""

    forwards: int = 0  # engine calls
    items: int = 0  # work items in them
    tokens: int = 0  # rows fed, padding excluded
    busy_ns: int = 0  # time inside the engine (a CUDA device is synchronised at the end of each batch)


class _Forward:
    def __init__(self, kv: SessionKV, work: Work):
        self.kv, self.work = kv, work
        self.future: Future = Future()
        self.submitted = time.perf_counter_ns()


class _Call:
    def __init__(self, fn: Callable, args: tuple, kwargs: dict):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.future: Future = Future()
        self.submitted = time.perf_counter_ns()


class ModelScheduler:
    def __init__(self, engine: Engine | None = None, config: SchedulerConfig = SchedulerConfig()):
        self.engine = engine
        self.config = config
        self.stats = SchedulerStats()
        self._queue: deque = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="edgespec-model", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------- callers
    def run(self, fn: Callable[..., T], *args, **kwargs) -> tuple[T, int]:
        """Run fn on the model thread; return (its result, nanoseconds it waited in the queue)."""
        call = _Call(fn, args, kwargs)
        self._submit(call)
        started, result = call.future.result()
        return result, started - call.submitted

    def new_kv(self) -> SessionKV:
        return self.engine.new_kv()

    def forward(self, kv: SessionKV, work: Work) -> ForwardOutput:
        """Append work's rows to kv in the next batch; its rows' outputs, with the time it queued."""
        kv.reserve()  # waiting for a free KV slot holds up this caller only, not the model thread
        item = _Forward(kv, work)
        self._submit(item)
        return item.future.result()

    def prefill(self, kv: SessionKV, ids: Sequence[int]) -> ForwardOutput:
        """Causal ids after what kv holds, in chunks; hidden of every row, logits of the last: [1, V]."""
        chunks = self._chunks(ids)
        outs = [self.forward(kv, Work.chunk(c, len(kv), logits=i == len(chunks) - 1)) for i, c in enumerate(chunks)]
        return _joined(outs)

    def prefill_tree(self, kv: SessionKV, ids: Sequence[int], tree: DraftTree) -> ForwardOutput:
        """ids (causal, in chunks) with a tree hung from ids[-1]. hidden: every row [len(ids) + N];
        logits: the rows of [ids[-1]] + nodes [1 + N]."""
        chunks = self._chunks(ids)
        outs = [self.forward(kv, Work.chunk(c, len(kv), logits=False)) for c in chunks[:-1]]
        outs.append(self.forward(kv, Work.chunk_tree(chunks[-1], tree, len(kv))))
        return _joined(outs)

    def forward_tree(self, kv: SessionKV, root: int, tree: DraftTree) -> ForwardOutput:
        """[root] + nodes after the cached past (the committed tokens but the last). Rows: [1 + N]."""
        return self.forward(kv, Work.tree(root, tree, len(kv)))

    def pending(self) -> int:
        """Items waiting for the worker (not counting what it runs now)."""
        with self._cv:
            return len(self._queue)

    def close(self) -> None:
        """Finish queued work, then stop the worker."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._worker:
            self._worker.join()

    # -------------------------------------------------------------- worker
    def _submit(self, item) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("the model scheduler is closed")
            self._queue.append(item)
            self._cv.notify()

    def _chunks(self, ids: Sequence[int]) -> list[list[int]]:
        size = self.config.prefill_chunk
        ids = list(ids)
        return [ids[i:i + size] for i in range(0, len(ids), size)] or [[]]

    def _next(self) -> list:
        """The oldest item, and the forwards right behind it while they fit the budget."""
        with self._cv:
            self._cv.wait_for(lambda: self._queue or self._closed)
            if not self._queue:
                return []
            first = self._queue.popleft()
            if isinstance(first, _Call):
                return [first]
            batch = [first]
            while self._queue and isinstance(self._queue[0], _Forward) and len(batch) < self.config.max_batch_items:
                works = [f.work for f in batch] + [self._queue[0].work]
                if self.engine.cost(works) > self.config.max_batch_tokens:
                    break
                batch.append(self._queue.popleft())
            return batch

    def _loop(self) -> None:
        while batch := self._next():
            started = time.perf_counter_ns()
            if isinstance(batch[0], _Call):
                call = batch[0]
                try:
                    call.future.set_result((started, call.fn(*call.args, **call.kwargs)))
                except BaseException as exc:  # noqa: BLE001 - the caller gets it
                    call.future.set_exception(exc)
                continue
            try:
                outs = self.engine.run([(f.kv, f.work) for f in batch])
                _sync(self.engine)
            except BaseException as exc:  # noqa: BLE001 - every caller in the batch gets it
                for f in batch:
                    f.future.set_exception(exc)
                continue
            busy = time.perf_counter_ns() - started
            s = self.stats
            s.forwards, s.items, s.busy_ns = s.forwards + 1, s.items + len(batch), s.busy_ns + busy
            s.tokens += sum(len(f.work) for f in batch)
            for f, out in zip(batch, outs):
                out.queue_ns = started - f.submitted
                f.future.set_result(out)


def _sync(engine: Engine) -> None:
    """Wait for the device so busy time is device time (a no-op on a CPU)."""
    device = engine.target.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _joined(outs: list[ForwardOutput]) -> ForwardOutput:
    """Chunks' outputs as one: every chunk's hidden rows, the last chunk's logits, the times summed."""
    hidden = outs[0].hidden if len(outs) == 1 else torch.cat([o.hidden for o in outs])
    return ForwardOutput(hidden, outs[-1].logits, sum(o.forward_ns for o in outs), sum(o.queue_ns for o in outs),
                         max(o.batch for o in outs))
