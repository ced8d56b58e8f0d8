"""ModelScheduler: the one place the target's forward passes run.

Every forward pass of every session (and of the plain-API decoder) is a job
run on a single worker thread, in arrival order, so two passes never touch the
same weights or caches concurrently by accident. The wait in the queue is
reported as ``queue_ns`` in the wire's Timings.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


class ModelScheduler:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgespec-model")

    def run(self, fn: Callable[..., T], *args, **kwargs) -> tuple[T, int]:
        """Run fn on the model thread; return (its result, nanoseconds it waited in the queue)."""
        submitted = time.perf_counter_ns()
        started: list[int] = []

        def job() -> T:
            started.append(time.perf_counter_ns())
            return fn(*args, **kwargs)

        result = self._pool.submit(job).result()
        return result, started[0] - submitted

    def close(self) -> None:
        """Finish queued jobs, then stop the worker."""
        self._pool.shutdown(wait=True)
