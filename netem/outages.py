"""Outage schedules as plain sequences of (start_s, duration_s) windows.

The relay follows these windows with cut/restore; keeping them pure makes the
schedule testable without sockets or clocks.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

from .profile import OutageSchedule


def outage_windows(schedule: OutageSchedule, rng: random.Random) -> Iterator[tuple[float, float]]:
    """Windows in start order, seconds from the relay's start; endless for poisson.

    poisson: the link stays up for an exponential time of mean `mean_up_s`, then is
    down for an exponential time of mean `mean_down_s`, and so on (an on/off process).
    """
    if schedule.kind == "fixed":
        yield from schedule.windows
        return
    t = 0.0
    while True:
        t += rng.expovariate(1 / schedule.mean_up_s)
        down = rng.expovariate(1 / schedule.mean_down_s)
        yield (t, down)
        t += down
