"""Prometheus metrics of a client (`edgespec client serve`'s /metrics), fed by its generations.

``EdgespecClient`` tells a ``ClientMetrics`` about every generation it runs (``watch``): when the
request arrived, when it got the client (requests run one at a time: the wait is the queue
time), its first token, and at the end the generation's own ``GenerationMetrics``. The series
use vLLM's names (``edgespec.shared.prom``) and meanings, from the client's side, as server/README.md's Metrics
table lists them (its client column); the server counts the same trees under ``edgespec:``.
``round_trip_time_seconds`` is every message the server answered (Open, Draft, Resume, Close) as the
client sees it, link included; ``request_verify_time_seconds`` the server's own verification time over
one generation (the server's ``verify_time_seconds`` has it per tree).

No ``kv_cache_usage_perc``: the drafter's cache has no capacity to be a share of.
"""
from __future__ import annotations

import threading
import time

from prometheus_client import Counter, Histogram

from edgespec.shared.prom import CLIENT_PREFIX, REQUEST_BUCKETS, STEP_BUCKETS, VllmMetrics

from .generation import GenerationResult, TokenEvent


class ClientMetrics(VllmMetrics):
    def __init__(self, model_name: str = "") -> None:  # the server's model, set once the client loaded
        super().__init__(model_name, "Number of requests generating now.", CLIENT_PREFIX)
        r = self.registry

        def counter(name: str, documentation: str) -> Counter:
            return Counter(CLIENT_PREFIX + name, documentation, registry=r)

        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        self.round_trip = Histogram(CLIENT_PREFIX + "round_trip_time_seconds",
                                    "Round trip of each message to the server as the client sees it, in seconds.",
                                    buckets=STEP_BUCKETS, registry=r)
        self.request_verify_time = Histogram(
            CLIENT_PREFIX + "request_verify_time_seconds",
            "The server's verification time over one request, in seconds.", buckets=REQUEST_BUCKETS, registry=r)
        # the pipelined loop and the tree planner
        self.guesses = counter("draft_ahead_guesses", "Verdicts a tree was drafted ahead for.")
        self.guess_hits = counter("draft_ahead_hits", "Verdicts a tree drafted ahead matched (it was sent at once).")
        self.saved = counter("draft_ahead_saved_seconds", "Drafting done ahead for guesses that hit, in seconds.")
        self.stopped = counter("draft_ahead_stopped", "Trees drafted ahead that stopped early: their verdict came and "
                                                      "ruled them out (or the Draft failed).")
        self.idle = counter("client_idle_seconds",
                            "Time the client waited for a verdict with nothing to draft, in seconds.")
        self.plain_steps = counter("plain_steps", "Drafts sent without a tree (plain decode steps).")
        self.queued_steps = counter("queued_steps", "Plain steps sent before the answer to the one before them came.")

    def watch(self) -> "RequestWatch":
        """A request has arrived; the watch follows it to its end."""
        return RequestWatch(self)

    def observe(self, result: GenerationResult) -> None:
        """A generation's own counters (the spec-decode counters come from these alone)."""
        m = result.metrics
        self.spec_decode.observe(m)
        self.prompt_tokens.inc(m.prompt_tokens)
        self.generation_tokens.inc(m.new_tokens)
        for seconds in m.round_trips_s:
            self.round_trip.observe(seconds)
        if m.num_drafts:
            self.request_verify_time.observe(m.verify_s)
        self.guesses.inc(m.guesses)
        self.guess_hits.inc(m.guess_hits)
        self.saved.inc(m.saved_s)
        self.stopped.inc(m.stopped_ahead)
        self.idle.inc(m.idle_s)
        self.plain_steps.inc(m.plain_steps)
        self.queued_steps.inc(m.queued_steps)


class RequestWatch:
    """One request's timeline: arrived (now), started (got the client), first token, finished."""

    def __init__(self, metrics: ClientMetrics):
        self.metrics = metrics
        self.arrived = time.monotonic()
        self._state = "waiting"  # -> "running" -> "done"; the gauges follow it exactly once
        self._first_token = False
        self._mutex = threading.Lock()
        metrics.waiting.inc()

    def started(self) -> None:
        with self._mutex:
            if self._state != "waiting":
                return
            self._state = "running"
        self.metrics.waiting.dec()
        self.metrics.running.inc()
        self.metrics.queue_time.observe(time.monotonic() - self.arrived)

    def event(self, event) -> None:
        if not self._first_token and isinstance(event, TokenEvent):
            self._first_token = True
            self.metrics.ttft.observe(time.monotonic() - self.arrived)

    def finished(self, result: GenerationResult) -> None:
        self.metrics.e2e.observe(time.monotonic() - self.arrived)
        self.metrics.observe(result)

    def close(self) -> None:
        """The request is over (done, failed or abandoned): it leaves the gauges."""
        with self._mutex:
            state, self._state = self._state, "done"
        if state == "waiting":
            self.metrics.waiting.dec()
        elif state == "running":
            self.metrics.running.dec()


class _NoWatch:
    """What a client without metrics watches requests with: nothing."""

    def started(self) -> None: ...

    def event(self, event) -> None: ...

    def finished(self, result: GenerationResult) -> None: ...

    def close(self) -> None: ...


NO_WATCH = _NoWatch()
