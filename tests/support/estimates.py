"""Loop estimates for tests that need the planner to choose plain steps whatever the tiny server's timings show."""
from __future__ import annotations

from edgespec.client.loop.planner import LoopEstimates


class TreesNeverPay(LoopEstimates):
    """A server where any tree costs 500 decode steps, kept whatever the answers' timings show: past its warm-up
    trees the loop sends plain steps only, and (a decode step of 0.1 ms against any round trip, loopback gRPC's
    included: queued, 1.5 round trips of 0.6 ms are 9 steps) each asks the target to decode ahead as many
    tokens as LoopConfig.decode_ahead allows."""

    def curve(self) -> dict[int, float]:
        return {0: 0.0001, 1: 0.05, 255: 1.0}


class DraftingOutlastsFlights(LoopEstimates):
    """A client whose drafter takes 0.2 s a pass against flights of 1 s, kept whatever it measures: a tree of the
    drafter's own shape drafted ahead would delay every verdict by more than the prior hit rate pays for, and
    one of 3 levels (5 passes with its bonus level and root) is done before the verdict."""

    def observe_draft(self, tree, seconds: float) -> None:
        super().observe_draft(tree, seconds)
        self.pass_s = 0.2

    def verify_flight_s(self, nodes: int) -> float:
        return 1.0


class CopiesPay(LoopEstimates):
    """A server where a decode step and a one-node tree cost 10 ms and a tree of 12 nodes about 14 ms, kept
    whatever the answers' timings show: a drafter whose trees miss loses to plain steps, and a lookup's copy 3 or
    more deep, at the copies' prior acceptance (LoopEstimates.COPY_PRIOR), beats them."""

    def curve(self) -> dict[int, float]:
        return {0: 0.01, 1: 0.01, 255: 0.1}
