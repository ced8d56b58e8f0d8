"""The model thread keeps serving after queued jobs that end before their first forward."""
from __future__ import annotations

import threading

from edgespec.server.scheduler import ModelScheduler


def _ends_at_once(value):
    """A job that returns without asking for a forward (a request cancelled, or answered from its state)."""
    return value
    yield  # pragma: no cover - makes this a generator


def test_worker_survives_jobs_that_end_before_any_forward():
    scheduler = ModelScheduler(engine=None)  # the jobs here never reach the engine
    assert scheduler.run_job(_ends_at_once(1)) == 1
    answers = []

    def later_callers():
        answers.append(scheduler.run_job(_ends_at_once(2)))
        answers.append(scheduler.run(lambda: 3)[0])

    caller = threading.Thread(target=later_callers, daemon=True)
    caller.start()
    caller.join(timeout=10)  # before the fix the worker had stopped after the first job: this waited forever
    assert answers == [2, 3], "the model thread stopped after a job that ended before its first forward"
    scheduler.close()
