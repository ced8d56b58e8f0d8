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

from prometheus_client import Counter, Gauge, Histogram

from edgespec.shared.prom import CLIENT_PREFIX, REQUEST_BUCKETS, STEP_BUCKETS, VllmMetrics

from .loop.generation import GenerationResult, TokenEvent


LINK_STATES = ("up", "down", "offline", "unknown")  # as /health reports them (http_health.LinkProbe.state)


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
        self.copy_steps = counter("copy_steps", "Drafts whose tree was a lookup's copy sent in place of a plain step.")
        # the link: what edgespec is for (calls to the server, bytes, offline tokens, disconnections)
        self.server_calls = counter("server_calls", "Requests the server answered: prefills (Open), verifications "
                                                    "and resumes.")
        self.sent_bytes = counter("link_sent_bytes", "Bytes sent to the server (serialised messages).")
        self.received_bytes = counter("link_received_bytes", "Bytes received from the server (serialised "
                                                             "messages, the target's activations included).")
        self.online_tokens = counter("online_tokens", "Output tokens the target verified or produced.")
        self.offline_tokens = counter("offline_tokens", "Output tokens generated offline and kept unverified "
                                                        "(provisional, or kept by the keep policy).")
        self.rolled_back = counter("rolled_back_tokens", "Offline tokens a rollback dropped when the link came back.")
        self.disconnects = counter("link_disconnects", "Times a generation found the link to the server dead.")
        self.resumes = counter("link_resumes", "Sessions resumed on the server after a disconnection.")
        self.link_state = Gauge(CLIENT_PREFIX + "link_state", "The link to the server, 1 for its state now: up (the "
                                "server answers), down (it does not), offline (a generation runs on the drafter "
                                "alone), unknown (the client is loading).", ["state"], registry=r)
        for state in LINK_STATES:
            self.link_state.labels(state=state).set(1 if state == "unknown" else 0)

    def set_link_state(self, state: str) -> None:
        """The link's state now (``LinkProbe.state``): its series is 1, the others 0."""
        for name in LINK_STATES:
            self.link_state.labels(state=name).set(1 if name == state else 0)

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
        self.copy_steps.inc(m.copy_steps)
        self.server_calls.inc(m.calls)
        self.sent_bytes.inc(m.bytes_up)
        self.received_bytes.inc(m.bytes_down)
        self.online_tokens.inc(m.online_tokens)
        self.offline_tokens.inc(m.offline_tokens)
        self.rolled_back.inc(m.rolled_back_tokens)
        self.disconnects.inc(m.disconnects)
        self.resumes.inc(m.resumes)


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
