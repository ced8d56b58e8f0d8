"""Loop estimates for tests that need the planner to choose plain steps whatever the tiny server's timings show."""
from __future__ import annotations

from edgespec.client.step_plan import LoopEstimates


class TreesNeverPay(LoopEstimates):
    """A server where any tree costs 50 decode steps, kept whatever the answers' timings show: past its warm-up
    trees the loop sends plain steps only, and (a decode step of 1 ms against any round trip) each asks the
    target to decode ahead as many tokens as LoopConfig.decode_ahead allows."""

    def curve(self) -> dict[int, float]:
        return {0: 0.001, 1: 0.05, 255: 1.0}
