"""The scheduler fills its batches: sessions that come back about together share one forward, and a session
alone never waits. The engine here only keeps time and records each batch (the scheduler is what is tested)."""
from __future__ import annotations

import random
import statistics
import threading
import time

import torch

from edgespec.server.engine.base import Engine, ForwardOutput, Work
from edgespec.server.scheduler import ModelScheduler, SchedulerConfig


class TimedEngine(Engine):
    """A forward takes `step_s` whatever it holds; every batch's size is recorded."""

    name = "timed"

    def __init__(self, step_s: float):
        self.step_s, self.batches = step_s, []
        self.target = type("Target", (), {"device": torch.device("cpu")})()

    def new_kv(self):
        return object()

    def run(self, items):
        self.batches.append(len(items))
        time.sleep(self.step_s)
        return [ForwardOutput(torch.zeros(len(w), 1), torch.zeros(1, 1)) for _, w in items]


def one_step(scheduler: ModelScheduler, kv):
    def job():
        out = yield kv, Work.chunk([1], 0)
        return out
    return scheduler.run_job(job())


def sessions(scheduler: ModelScheduler, n: int, steps: int, rtt_s: float, jitter_s: float) -> list[float]:
    """n sessions in a closed loop: a forward, then a round trip, `steps` times; each step's time (send to answer)."""
    times: list[float] = []
    lock = threading.Lock()

    def session(seed: int) -> None:
        kv, rng = object(), random.Random(seed)
        for _ in range(steps):
            t = time.perf_counter()
            one_step(scheduler, kv)
            with lock:
                times.append(time.perf_counter() - t)
            time.sleep(rtt_s + rng.uniform(0, jitter_s))

    threads = [threading.Thread(target=session, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def mean_batch(engine: TimedEngine, skip: int) -> float:
    return statistics.fmean(engine.batches[skip:])


def test_sessions_that_come_back_together_share_a_forward():
    step, rtt, jitter, n = 0.01, 0.03, 0.004, 8
    config = SchedulerConfig(max_gather_s=0.05)
    filled = TimedEngine(step)
    sessions(ModelScheduler(filled, config), n, 30, rtt, jitter)
    apart = TimedEngine(step)
    sessions(ModelScheduler(apart, SchedulerConfig(max_gather_s=0.0)), n, 30, rtt, jitter)
    assert mean_batch(filled, 10) >= 0.8 * n  # every session in flight rides the same forward
    assert mean_batch(apart, 10) < mean_batch(filled, 10)  # without gathering the arrivals split the batches


def test_a_session_alone_waits_for_no_one():
    step, rtt = 0.01, 0.02
    config = SchedulerConfig(max_gather_s=0.05)
    gathered = ModelScheduler(TimedEngine(step), config)
    plain = ModelScheduler(TimedEngine(step), SchedulerConfig(max_gather_s=0.0))
    with_gather = statistics.median(sessions(gathered, 1, 20, rtt, 0.0))
    without = statistics.median(sessions(plain, 1, 20, rtt, 0.0))
    assert with_gather < without + 0.005  # nobody else is due: no wait


def test_streams_already_queued_are_not_held_for_a_session_far_off():
    """Four streams decode back to back (each forward re-queues them at once) beside one session due back only
    every 40 ms: a stream's token must not wait for it (a forward is 5 ms: at most 5 / 4 ms of waiting)."""
    engine = TimedEngine(0.005)
    scheduler = ModelScheduler(engine, SchedulerConfig(max_gather_s=0.05))
    gaps: list[float] = []

    def stream() -> None:
        kv, last = object(), None

        def job():
            for _ in range(60):
                yield kv, Work.chunk([1], 0)
                nonlocal last
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
        scheduler.run_job(job())

    streams = [threading.Thread(target=stream) for _ in range(4)]
    session = threading.Thread(target=sessions, args=(scheduler, 1, 8, 0.04, 0.0))
    for t in [*streams, session]:
        t.start()
    for t in [*streams, session]:
        t.join()
    assert statistics.median(gaps) < 0.009 and max(gaps) < 0.03
