"""ModelScheduler: the one place the target's forward passes run.

One worker thread owns the model and runs every job's tensor work, so two
threads never compete for the weights, the KV or the CPU's thread pool. A job
is a generator: it yields the forwards it needs, ``(kv, work)``, gets each
one's ``ForwardOutput`` back, and returns its answer:

    def verify_job():
        out = yield from scheduler.forward_tree(kv, root, tree)
        ...acceptance, keep the accepted rows...
        return answer

    answer = scheduler.run_job(verify_job())  # the caller waits

The worker gathers every job waiting on a forward into one batch for the
engine, oldest first, under a token budget, so no job waits more than one
batch behind a newer one. Before a forward it waits, at most
``max_gather_s``, for the sessions it expects back by then (each one's last
answer plus its own mean cycle): sessions behind a link return about
together, and without the wait the first to arrive would run alone and the
rest a forward later, a split that then lasts. A job's next forward queues behind the work that
arrived meanwhile: a long prompt goes in chunks (``prefill``) and cannot stall
the other sessions. ``run(fn)`` runs any other function on the worker, in
arrival order. The wait for the batch is reported as ``queue_ns`` in the wire's
Timings.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Generator, Sequence, TypeVar

import torch

from edgespec.shared.kv import SessionKV
from edgespec.shared.tree import DraftTree

from .engine.base import Engine, ForwardOutput, Work

T = TypeVar("T")
Job = Generator[tuple[SessionKV, Work], ForwardOutput, T]  # yields forwards, returns its answer


@dataclass(frozen=True)
class SchedulerConfig:
    """How forwards are batched."""

    max_batch_tokens: int = 2048  # tokens one forward computes (padding included); the oldest item always runs
    max_batch_items: int = 64  # jobs in one forward
    prefill_chunk: int = 512  # a prompt goes in chunks of this many tokens, each queued behind newer work
    # Gathering: N sessions behind a link come back about together, each a round trip after its answer; the
    # first to arrive would take a forward alone and the rest the next one, and a split once made lasts (the
    # groups keep their phase). So before a forward the worker waits for the sessions it expects back within
    # `max_gather_s` (each one's answer time plus its own running mean cycle), then runs them all at once. A
    # session alone, or one nobody else is due with, never waits; 0 turns gathering off.
    max_gather_s: float = 0.05
    active_s: float = 2.0  # a session not back this long after it was due is no longer expected


@dataclass
class SchedulerStats:
    """What the worker did: the server bench's device time comes from here."""

    forwards: int = 0  # engine calls
    items: int = 0  # work items in them
    tokens: int = 0  # rows fed, padding excluded
    busy_ns: int = 0  # time inside the engine: on CUDA the device's, from events (no synchronisation: a
    # batch's readback finishes it; ``ModelScheduler.settle`` waits for the last), else wall time


class _Item:
    """A queued job (waiting to start, or for a forward) or a plain call."""

    def __init__(self, job: Job | None = None, call: Callable | None = None):
        self.job, self.call = job, call
        self.future: Future = Future()
        self.waiting: tuple[SessionKV, Work] | None = None  # the forward the job asked for
        self.since = time.perf_counter_ns()  # queued (or asked for its forward) at


class ModelScheduler:
    def __init__(self, engine: Engine | None = None, config: SchedulerConfig = SchedulerConfig()):
        self.engine = engine
        self.config = config
        self.stats = SchedulerStats()
        self._clock = BusyClock(engine.target.device if engine is not None else torch.device("cpu"))
        self._queue: deque[_Item] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._due: dict[int, list[float]] = {}  # id of a job's KV -> [its last answer, its mean cycle]: when it
        # is due back (gathering's census)
        self._step_s = 0.0  # running mean of a forward's wall time
        self._worker = threading.Thread(target=self._loop, name="edgespec-model", daemon=True)
        self._worker.start()

    def run(self, fn: Callable[..., T], *args, **kwargs) -> tuple[T, int]:
        """Run fn on the model thread; return (its result, nanoseconds it waited in the queue)."""
        item = _Item(call=lambda: fn(*args, **kwargs))
        self._submit(item)
        started, result = item.future.result()
        return result, started - item.since

    def run_job(self, job: Job[T], kv: SessionKV | None = None) -> T:
        """Run a job on the model thread, its forwards batched with other jobs'; wait for its answer.

        kv: the KV the job feeds, to take what it needs up front here (``SessionKV.reserve``), on this caller's
        thread rather than the model's.
        """
        if kv is not None:
            kv.reserve()
        item = _Item(job=job)
        self._submit(item)
        return item.future.result()

    def new_kv(self) -> SessionKV:
        return self.engine.new_kv()

    # Forwards, for jobs: `out = yield from scheduler.forward(kv, work)`.
    @staticmethod
    def forward(kv: SessionKV, work: Work) -> Job[ForwardOutput]:
        """Append work's rows to kv in the next batch; their outputs."""
        return (yield kv, work)

    def prefill(self, kv: SessionKV, ids: Sequence[int]) -> Job[ForwardOutput]:
        """Causal ids after what kv holds, in chunks; hidden of every row, logits of the last: [1, V]."""
        chunks = self._chunks(ids)
        outs = []
        for i, chunk in enumerate(chunks):
            outs.append((yield kv, Work.chunk(chunk, len(kv), logits=i == len(chunks) - 1)))
        return _joined(outs)

    def prefill_tree(self, kv: SessionKV, ids: Sequence[int], tree: DraftTree) -> Job[ForwardOutput]:
        """ids (causal, in chunks) with a tree hung from ids[-1]. hidden: every row [len(ids) + N];
        logits: the rows of [ids[-1]] + nodes [1 + N]."""
        chunks = self._chunks(ids)
        outs = []
        for chunk in chunks[:-1]:
            outs.append((yield kv, Work.chunk(chunk, len(kv), logits=False)))
        outs.append((yield kv, Work.chunk_tree(chunks[-1], tree, len(kv))))
        return _joined(outs)

    @staticmethod
    def forward_tree(kv: SessionKV, root: int, tree: DraftTree, accept: bool = False) -> Job[ForwardOutput]:
        """[root] + nodes after the cached past (the committed tokens but the last). Rows: [1 + N].
        accept: greedy verification by the engine where it can (``Work.accept``)."""
        return (yield kv, Work.tree(root, tree, len(kv), accept))

    def settle(self) -> SchedulerStats:
        """The stats with every finished batch's device time counted (waits for the device; for benchmarks)."""
        return self.run(lambda: (self._clock.collect(self.stats, wait=True), self.stats)[1])[0]

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

    def _submit(self, item: _Item) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("the model scheduler is closed")
            self._queue.append(item)
            self._cv.notify()

    def _chunks(self, ids: Sequence[int]) -> list[list[int]]:
        size = self.config.prefill_chunk
        ids = list(ids)
        return [ids[i:i + size] for i in range(0, len(ids), size)]

    def _advance(self, item: _Item, value: ForwardOutput | None) -> bool:
        """Run item's job on to its next forward (True) or to its end (False: the future is set)."""
        item.waiting = None  # a finished job must not pin its KV (a dropped session's blocks) until the next batch
        try:
            kv, work = item.job.send(value)
            self.engine.check(kv, work)
        except StopIteration as done:
            item.future.set_result(done.value)
            return False
        except BaseException as exc:  # noqa: BLE001 - the caller gets it, the batch goes on without it
            item.job.close()
            item.future.set_exception(exc)
            return False
        item.waiting, item.since = (kv, work), time.perf_counter_ns()
        return True

    def _next(self) -> list[_Item]:
        """A call alone, or a batch: the oldest jobs waiting on a forward while they fit the budget.
        Empty only once the scheduler is closed: queued jobs that all end before their first forward
        (a cancelled or already finished request) leave nothing to run, and the worker waits again
        rather than stop with jobs still to come."""
        with self._cv:
            while True:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return []
                self._gather()
                batch: list[_Item] = []
                while self._queue:
                    item = self._queue[0]
                    if item.call is not None:
                        if not batch:
                            self._queue.popleft()
                            return [item]
                        break
                    # A job not started yet runs to its first forward here, under the lock (a job only builds
                    # its first forward before it yields it); one that ended without a forward leaves the queue.
                    if item.waiting is None and not self._advance(item, None):
                        self._queue.popleft()
                        continue
                    works = [i.waiting[1] for i in batch] + [item.waiting[1]]
                    if batch and (len(works) > self.config.max_batch_items
                                  or self.engine.cost(works) > self.config.max_batch_tokens):
                        break
                    batch.append(self._queue.popleft())
                if batch:
                    return batch

    def _start_queued(self) -> None:
        """Under the lock: run jobs not started yet to their first forward (a job only builds its first forward
        before it yields it); one that ended without a forward leaves the queue."""
        for item in [i for i in self._queue if i.job is not None and i.waiting is None]:
            if not self._advance(item, None):
                self._queue.remove(item)

    def _gather(self) -> None:
        """Under the lock, with work queued: wait for the sessions due back within ``max_gather_s`` (an arrival
        notifies the condition), so that one forward takes them all."""
        cap = self.config.max_gather_s
        if cap <= 0:
            return
        self._start_queued()
        now = time.perf_counter()
        for key in [k for k, (answer, cycle) in self._due.items() if answer + cycle + self.config.active_s < now]:
            del self._due[key]  # gone (closed, dropped) or slow: no longer waited for
        while not self._closed and self._queue and all(i.call is None for i in self._queue):
            here = {id(i.waiting[0]) for i in self._queue if i.waiting is not None}
            # each is given a quarter of its cycle past its time (a thread or a link a little late is still due)
            due = [a + 1.25 * c for k, (a, c) in self._due.items() if k not in here and a + c <= now + cap]
            if not due or len(here) >= self.config.max_batch_items:
                return
            # Jobs that come straight back (plain-API streams, prompt chunks: a cycle under half a forward) would
            # lose a token's time for each wait: with one of them queued, a wait is bounded by what it saves the
            # ones due (about a forward each). Sessions behind links wait up to the cap: the phase once merged,
            # every later forward takes them all.
            busy = any(self._due.get(k, (0.0, self._step_s))[1] < self._step_s / 2 for k in here)
            limit = min(cap, self._step_s * len(due) / max(1, len(here))) if busy else cap
            left = min(max(due), now + limit) - time.perf_counter()
            if left <= 0:
                return
            self._cv.wait(left)
            self._start_queued()

    def _census(self, batch: list[_Item], answered: float, took: float) -> None:
        """Under the lock: each item's session answered now; its cycle (answer to its next arrival) measured;
        the forward took ``took`` seconds (the running mean bounds a wait)."""
        self._step_s = took if not self._step_s else 0.8 * self._step_s + 0.2 * took
        for item in batch:
            key = id(item.waiting[0])
            last = self._due.get(key)
            arrived = item.since / 1e9  # when it queued for this forward (perf_counter)
            if last is None:
                self._due[key] = [answered, 0.0]
            else:
                cycle = max(0.0, arrived - last[0])
                last[1] = cycle if last[1] == 0.0 else 0.8 * last[1] + 0.2 * cycle
                last[0] = answered

    def _loop(self) -> None:
        while batch := self._next():
            started = time.perf_counter_ns()
            if batch[0].call is not None:
                item = batch[0]
                try:
                    item.future.set_result((started, item.call()))
                except BaseException as exc:  # noqa: BLE001 - the caller gets it
                    item.future.set_exception(exc)
                continue
            try:
                mark = self._clock.start()
                outs = self.engine.run([i.waiting for i in batch])
                self._clock.stop(mark, started, self.stats)
            except BaseException as exc:  # noqa: BLE001 - every job in the batch gets it
                for item in batch:
                    item.job.close()
                    item.future.set_exception(exc)
                continue
            s = self.stats
            if self.config.max_gather_s > 0:
                with self._cv:
                    now = time.perf_counter()
                    self._census(batch, now, now - started / 1e9)
            s.forwards, s.items = s.forwards + 1, s.items + len(batch)
            s.tokens += sum(len(i.waiting[1]) for i in batch)
            again = []
            for item, out in zip(batch, outs):
                out.queue_ns = started - item.since
                if self._advance(item, out):
                    again.append(item)  # its next forward queues behind what arrived meanwhile
            self.engine.release_batch()  # every job of the batch has run on: their KV may be preempted again
            if again:
                with self._cv:
                    self._queue.extend(again)


class BusyClock:
    """Busy time of the engine's batches without synchronising for it: on CUDA a pair of events a batch,
    counted once the end event has completed (a batch's readback completes it, so by the next batch it
    has); elsewhere wall time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pending: deque = deque()  # (start, end) events not counted yet

    def start(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, mark, started_ns: int, stats: SchedulerStats) -> None:
        if not self.cuda:
            stats.busy_ns += time.perf_counter_ns() - started_ns
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((mark, end))
        self.collect(stats)

    def collect(self, stats: SchedulerStats, wait: bool = False) -> None:
        while self._pending and (wait or self._pending[0][1].query()):
            begin, end = self._pending.popleft()
            end.synchronize()  # a no-op unless wait: query() said it is done
            stats.busy_ns += int(begin.elapsed_time(end) * 1e6)


def _joined(outs: list[ForwardOutput]) -> ForwardOutput:
    """Chunks' outputs as one: every chunk's hidden rows, the last chunk's logits, the times summed."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    return ForwardOutput(torch.cat([o.hidden for o in outs]), last.logits, sum(o.forward_ns for o in outs),
                         sum(o.queue_ns for o in outs), last.best, last.accepted, last.next_token)
