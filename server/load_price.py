"""What one more tree node costs the server's users at today's load: the price a client plans its trees with.

A client sizes its trees against its own time: the round trip, its drafting and the server's time on its
Draft. Alone on a server that is right. With S sessions in each forward, a node one client adds makes
the step longer for all S of them, and a client that sees only its own share drafts trees that are too big
for the server: under load, big trees make batched verification compute-bound and the server's capacity
falls below a plain API's. So the server publishes, with every answer (``Timings``):

- ``row_cost_ns``: what one more row adds to a forward of the batches running now, and
- ``sharing``: how many items (sessions, plain-API streams) those forwards held on average;

and a client counts each node it drafts at ``row_cost_ns * (sharing - 1)`` beside its own time
(``client/loop/planner.py``): nothing changes alone (sharing 1), and trees shrink, down to plain steps,
as the server fills.

The row cost comes from the scheduler's running totals over the last ``window`` forwards: the step time
above the lone decode step (the cost curve's size 0, which is the weights' read) shared by the rows fed,
and never below the cost curve's own slope (what a row adds to a lone session's step). It is refreshed
at most every ``window`` forwards; readers get the last value.
"""
from __future__ import annotations

import threading
from dataclasses import astuple, dataclass


@dataclass(frozen=True)
class Totals:
    """The scheduler's running totals (``SchedulerStats``) at one moment."""

    forwards: int = 0
    items: int = 0
    tokens: int = 0
    busy_ns: int = 0


@dataclass(frozen=True)
class Price:
    row_cost_ns: int = 0  # what one more row adds to a forward now (0: not known yet)
    sharing: float = 1.0  # items per forward lately (1: alone, or not known yet)


def price_of(delta: Totals, floor_ns: float, slope_ns: float) -> Price:
    """The price from the totals of some forwards: ``floor_ns`` a lone decode step, ``slope_ns`` what a row adds
    to one (the cost curve's); a pure function."""
    if delta.forwards <= 0 or delta.tokens <= 0:
        return Price(int(slope_ns), 1.0)
    step_ns = delta.busy_ns / delta.forwards
    rows = delta.tokens / delta.forwards
    above = max(0.0, step_ns - floor_ns) / rows
    return Price(int(max(slope_ns, above)), max(1.0, delta.items / delta.forwards))


class LoadPrice:
    """The running price (thread-safe): ``update(totals)`` from any thread, ``now()`` to read."""

    def __init__(self, floor_ns: float = 0.0, slope_ns: float = 0.0, window: int = 32):
        self.floor_ns, self.slope_ns, self.window = floor_ns, slope_ns, window
        self._lock = threading.Lock()
        self._last = Totals()
        self._price = Price(int(slope_ns), 1.0)

    def calibrate(self, nodes: tuple[int, ...], total_ns: tuple[int, ...]) -> None:
        """The cost curve measured at start (a lone session): its decode step and its slope per node."""
        if not nodes:
            return
        with self._lock:
            self.floor_ns = float(total_ns[0])
            if len(nodes) > 1 and nodes[-1] > nodes[0]:
                self.slope_ns = max(0.0, (total_ns[-1] - total_ns[0]) / (nodes[-1] - nodes[0]))
            self._price = Price(int(self.slope_ns), self._price.sharing)

    def update(self, totals: Totals) -> Price:
        """Refresh from the scheduler's totals once ``window`` forwards ran since the last refresh."""
        with self._lock:
            delta = Totals(*(a - b for a, b in zip(astuple(totals), astuple(self._last))))
            if delta.forwards >= self.window:
                self._price = price_of(delta, self.floor_ns, self.slope_ns)
                self._last = totals
            return self._price

    def now(self) -> Price:
        with self._lock:
            return self._price
