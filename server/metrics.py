"""Prometheus metrics of one server (its own registry, so several servers can share a process).

Two families: vLLM's names as ``edgespec:*`` (see ``edgespec.shared.prom``; relabelled to ``vllm:*``
they fill a vLLM Grafana dashboard), and edgespec's own ``edgespec_*`` series for what vLLM has no
name for (sessions, resumes, bytes, errors). One family per fact: nothing is exported under both.

What a vLLM *request* is here:

- a speculative session, from Open to Close, whose first token is Open's answer; its generation
  tokens are the tokens the server committed for it (accepted + bonus, Resume's agreed ones too);
- or a plain-API generation (one choice), from its first decode step to its last token.

For both: ``time_to_first_token``, ``e2e_request_latency``, ``request_prefill_time`` (to the first
token), ``request_decode_time`` (first token to last), ``request_inference_time`` (their sum),
``inter_token_latency`` (between two answers that commit tokens: a session's Draft round trip, client
and link included, as the server sees it; one observation per answer however many tokens it carries,
as vLLM observes one per engine step), ``request_time_per_output_token`` (decode time / (tokens - 1)),
``request_prompt_tokens``, ``request_generation_tokens``, ``request_max_num_generation_tokens``,
``request_params_max_tokens`` (Open's max_new_tokens, the plain API's max_tokens),
``prompt_tokens_total``, ``generation_tokens_total``, and ``request_success_total{finished_reason}``:
``stop`` (EOS, or the client closed before its length: a stop string), ``length`` (max tokens reached),
``abort`` (a session dropped by TTL or memory, a plain-API caller gone).

- ``num_requests_running``: sessions held plus plain-API generations under way;
- ``num_requests_waiting``: forward passes queued for the model thread;
- ``request_queue_time``: how long each Open, Draft or Resume waited for the model thread;
- ``verify_time_seconds``: the server's time per Draft (empty trees included);
- ``kv_cache_usage_perc``: KV memory of all sessions over --max-kv-gb.

And ``edgespec_engine_step_seconds{part}`` (a counter): the engine's steps split into the host's parts
(``pack``, ``launch``, ``readback``, ``items``) and the forward alone (``device``: CUDA events on a GPU),
with ``edgespec_engine_steps``, so a change is judged on the part it moves (``engine.timing``); and the
scheduler's ``edgespec_scheduler_forwards``, ``_items`` and ``_rows`` (items / forwards: the mean batch).

Every ``edgespec:`` series carries ``model_name`` (the served name) and ``engine``; no series is ``*_created``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from edgespec.shared.metrics import SpecDecodeStats
from edgespec.shared.prom import (PREFIX, REQUEST_BUCKETS, STEP_BUCKETS, TOKEN_LATENCY_BUCKETS, VllmMetrics,
                                  size_buckets)

if TYPE_CHECKING:
    from .engine.timing import StepTimes
    from .session import StepResult

T = TypeVar("T")

FINISHED_REASONS = ("stop", "length", "abort")  # vLLM's request_success_total labels


@dataclass
class RequestClock:
    """One request's timeline and sizes (a session or a plain-API choice), in time.monotonic() seconds."""

    arrived: float  # Open arrived / the plain-API generation started
    prompt_tokens: int
    max_new_tokens: int = 0  # 0 = no limit known
    first_token: float | None = None  # the first generated token was ready
    last_token: float | None = None  # the last one was
    generated: int = 0  # tokens generated so far
    last_id: int = -1  # the last token's id (EOS tells "stop")


class ServerMetrics(VllmMetrics):
    def __init__(self, model_name: str = "", max_model_len: int = 32768) -> None:
        super().__init__(model_name, "Number of requests in model execution batches.")
        r, p = self.registry, PREFIX
        self.sessions = Gauge("edgespec_sessions", "Sessions held by the server", registry=r)
        self.sessions_opened = Counter("edgespec_sessions_opened", "Sessions opened", registry=r)
        self.sessions_dropped = Counter("edgespec_sessions_dropped", "Sessions dropped by TTL or memory cap",
                                        ["reason"], registry=r)
        self.resumes = Counter("edgespec_resumes", "Resume requests", ["restored"], registry=r)
        self.bytes_in = Counter("edgespec_bytes_in", "Protobuf bytes received on session streams", registry=r)
        self.bytes_out = Counter("edgespec_bytes_out", "Protobuf bytes sent on session streams", registry=r)
        self.errors = Counter("edgespec_errors", "Calls ended with an error status", ["code"], registry=r)
        self.api_requests = Counter("edgespec_api_requests", "Plain-API requests", ["endpoint"], registry=r)
        # vLLM's names
        self.verify_time = Histogram(p + "verify_time_seconds", "Server time per Draft (a verification) in seconds.",
                                     buckets=STEP_BUCKETS, registry=r)
        self.kv_usage = Gauge(p + "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", registry=r)
        self.prefix_cache_queries = Counter(p + "prefix_cache_queries",
                                            "Prefix cache queries, in terms of number of queried tokens.", registry=r)
        self.prefix_cache_hits = Counter(p + "prefix_cache_hits",
                                         "Prefix cache hits, in terms of number of cached tokens.", registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Number of prefill tokens processed.", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Number of generation tokens processed.",
                                         registry=r)
        self.request_success = Counter(p + "request_success", "Count of successfully processed requests.",
                                       ["finished_reason"], registry=r)
        for reason in FINISHED_REASONS:
            self.request_success.labels(finished_reason=reason)
        sizes = size_buckets(max_model_len)
        self.request_prompt_tokens = Histogram(p + "request_prompt_tokens", "Number of prefill tokens processed.",
                                               buckets=sizes, registry=r)
        self.request_generation_tokens = Histogram(p + "request_generation_tokens",
                                                   "Number of generation tokens processed.", buckets=sizes, registry=r)
        self.request_max_generation_tokens = Histogram(
            p + "request_max_num_generation_tokens",
            "Histogram of maximum number of generation tokens of a request's sequences (one sequence a request).",
            buckets=sizes, registry=r)
        self.request_params_max_tokens = Histogram(p + "request_params_max_tokens",
                                                   "Histogram of the max_tokens request parameter.", buckets=sizes,
                                                   registry=r)
        self.inter_token_latency = Histogram(
            p + "inter_token_latency_seconds", "Histogram of inter-token latency in seconds (one per answer that "
            "commits tokens).", buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(
            p + "request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
            buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.prefill_time = Histogram(p + "request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", buckets=REQUEST_BUCKETS,
                                      registry=r)
        self.decode_time = Histogram(p + "request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.", buckets=REQUEST_BUCKETS,
                                     registry=r)
        self.inference_time = Histogram(p + "request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.",
                                        buckets=REQUEST_BUCKETS, registry=r)
        self._api_running = 0  # plain-API generations under way
        self._requests: dict[str, RequestClock] = {}  # session id -> its clock
        self._eos: frozenset[int] = frozenset()
        self._mutex = threading.Lock()

    def watch(self, eos_ids: Iterable[int], sessions: Callable[[], int], waiting: Callable[[], int],
              kv_usage: Callable[[], float]) -> None:
        """Read the gauges when scraped: sessions held, forwards and jobs queued for the model thread, and the
        share of the KV budget in use (0-1). eos_ids: the target's, to tell a stop from a length cut."""
        self._eos = frozenset(eos_ids)
        self.sessions.set_function(sessions)
        self.running.set_function(lambda: sessions() + self._api_running)
        self.waiting.set_function(waiting)
        self.kv_usage.set_function(kv_usage)

    def watch_engine(self, times: Callable[[], "StepTimes"], preemptions: Callable[[], int] = lambda: 0) -> None:
        """Export the engine's step-time totals (``engine.timing.StepTimes``) and its preemptions so far (sessions
        whose KV blocks went to others, recomputed at their next forward), read when scraped."""
        self.registry.register(_StepTimesCollector(times, preemptions))

    def watch_scheduler(self, stats: Callable[[], object]) -> None:
        """Export the scheduler's batching totals (``SchedulerStats``: forwards, items, rows), read when scraped:
        items / forwards is the mean batch."""
        self.registry.register(_SchedulerCollector(stats))

    def _started(self, clock: RequestClock) -> None:
        self.prompt_tokens.inc(clock.prompt_tokens)
        self.request_prompt_tokens.observe(clock.prompt_tokens)

    def _tokens(self, clock: RequestClock, count: int, last_id: int, now: float) -> None:
        """`count` tokens generated at `now` (one answer, or one plain-API step)."""
        if count <= 0:
            return
        if clock.first_token is None:
            clock.first_token = now
            self.ttft.observe(now - clock.arrived)
        else:
            self.inter_token_latency.observe(now - (clock.last_token or now))
        clock.last_token, clock.generated, clock.last_id = now, clock.generated + count, last_id
        self.generation_tokens.inc(count)

    def _finished(self, clock: RequestClock, reason: str, now: float) -> None:
        self.request_success.labels(finished_reason=reason).inc()
        self.e2e.observe(now - clock.arrived)
        self.request_generation_tokens.observe(clock.generated)
        self.request_max_generation_tokens.observe(clock.generated)
        if clock.max_new_tokens:
            self.request_params_max_tokens.observe(clock.max_new_tokens)
        if clock.first_token is not None:
            prefill, decode = clock.first_token - clock.arrived, (clock.last_token or now) - clock.first_token
            self.prefill_time.observe(prefill)
            self.decode_time.observe(decode)
            self.inference_time.observe(prefill + decode)
            if clock.generated > 1:
                self.time_per_output_token.observe(decode / (clock.generated - 1))

    def opened(self, session_id: str, tree_nodes: int, result: "StepResult", max_new_tokens: int = 0) -> None:
        """An Open answered: its time is the session's time to first token; a tree sent with it is a draft."""
        self.sessions_opened.inc()
        t, now = result.timings, time.monotonic()
        self.queue_time.observe(t.queue_ns / 1e9)
        accepted = len(result.accepted)
        clock = RequestClock(now - t.total_ns / 1e9, result.committed_len - accepted - 1, max_new_tokens)
        self._started(clock)
        self._observe_draft(tree_nodes, accepted)
        self._tokens(clock, accepted + 1, result.next_token, now)
        with self._mutex:
            self._requests[session_id] = clock

    def verified(self, session_id: str, tree_nodes: int, result: "StepResult") -> None:
        """A Draft answered."""
        t = result.timings
        self.verify_time.observe(t.total_ns / 1e9)
        self.queue_time.observe(t.queue_ns / 1e9)
        self._observe_draft(tree_nodes, len(result.accepted))
        with self._mutex:
            clock = self._requests.get(session_id)
        if clock is not None:
            self._tokens(clock, len(result.accepted) + len(result.decoded) + 1, result.next_token, time.monotonic())

    def _observe_draft(self, tree_nodes: int, accepted: int) -> None:
        """One verified tree (an empty one is no draft); per-position counts come from the stats type."""
        stats = SpecDecodeStats()
        stats.observe_draft(tree_nodes, accepted)
        self.spec_decode.observe(stats)

    def resumed(self, session_id: str, restored: bool, result: "StepResult", kept: int | None = None,
                max_new_tokens: int = 0) -> None:
        """A Resume answered: the tokens it commits are the provisional ones kept (None: the agreed ones) and the
        bonus token."""
        self.resumes.labels(restored=str(restored).lower()).inc()
        self.queue_time.observe(result.timings.queue_ns / 1e9)
        now = time.monotonic()
        with self._mutex:  # a session rebuilt here (after a restart, on another replica) starts now
            clock = self._requests.get(session_id)
            if clock is None:
                clock = self._requests[session_id] = RequestClock(now - result.timings.total_ns / 1e9, 0,
                                                                  max_new_tokens)
        self._tokens(clock, (result.agreed if kept is None else kept) + 1, result.next_token, now)

    def closed(self, session_id: str) -> None:
        """The client closed its session: the request is over."""
        with self._mutex:
            clock = self._requests.pop(session_id, None)
        if clock is not None:  # "stop" at EOS, or ended before its limit: a stop string (or it had what it wanted)
            length = clock.last_id not in self._eos and 0 < clock.max_new_tokens <= clock.generated
            self._finished(clock, "length" if length else "stop", time.monotonic())

    def dropped(self, session_id: str, why: str) -> None:
        """Expired or evicted: the request was aborted."""
        self.sessions_dropped.labels(reason=why).inc()
        with self._mutex:
            clock = self._requests.pop(session_id, None)
        if clock is not None:
            self._finished(clock, "abort", time.monotonic())

    def api_generation(self, tokens: Iterable[T], prompt_tokens: int, max_new_tokens: int,
                       token_id: Callable[[T], int], cancelled: Callable[[], bool]) -> Iterator[T]:
        """Pass a plain-API generation's tokens through, timing each. Run to its end it finished by EOS ("stop")
        or by its length; stopped early, by a stop string ("stop") unless `cancelled()` (the caller left: "abort")."""
        clock = RequestClock(time.monotonic(), prompt_tokens, max_new_tokens)
        self._started(clock)
        with self._mutex:
            self._api_running += 1
        ended = False
        try:
            for token in tokens:
                self._tokens(clock, 1, token_id(token), time.monotonic())
                yield token
            ended = True
        finally:  # the end, a stop string (the caller stops iterating) or a client gone
            if ended:
                reason = "stop" if clock.last_id in self._eos else "length"
            else:
                reason = "abort" if cancelled() else "stop"
            self._finished(clock, reason, time.monotonic())
            with self._mutex:
                self._api_running -= 1


class _StepTimesCollector:
    """The engine's running step-time totals as counters, read at each scrape (the scheduler thread writes
    them; a scrape reads plain ints)."""

    PARTS = ("pack", "launch", "device", "readback", "items")

    def __init__(self, times: Callable[[], "StepTimes"], preemptions: Callable[[], int]):
        self._times, self._preemptions = times, preemptions

    def collect(self):
        t = self._times()
        seconds = CounterMetricFamily("edgespec_engine_step_seconds", "Engine step time by part: the host's "
                                      "packing, launch, readback and per-item work, and the forward alone (device)",
                                      labels=["part"])
        for part in self.PARTS:
            seconds.add_metric([part], getattr(t, part + "_ns") / 1e9)
        yield seconds
        yield CounterMetricFamily("edgespec_engine_steps", "Engine steps run", value=t.steps)
        yield CounterMetricFamily("edgespec_engine_preemptions", "Sessions whose KV blocks were given to others "
                                  "when the pool ran short (vLLM's recompute preemption): recomputed at their next "
                                  "forward", value=self._preemptions())

    def describe(self):
        return []  # no names claimed at registration: collect() runs at scrape time only


class _SchedulerCollector:
    """How the scheduler batched: forwards run, work items in them (sessions' steps, plain-API streams' tokens)
    and rows fed (padding excluded), read at each scrape."""

    def __init__(self, stats: Callable[[], object]):
        self._stats = stats

    def collect(self):
        s = self._stats()
        yield CounterMetricFamily("edgespec_scheduler_forwards", "Batched forwards the scheduler ran", value=s.forwards)
        yield CounterMetricFamily("edgespec_scheduler_items", "Work items in those forwards (items / forwards: "
                                  "the mean batch)", value=s.items)
        yield CounterMetricFamily("edgespec_scheduler_rows", "Rows fed to those forwards, padding excluded",
                                  value=s.tokens)

    def describe(self):
        return []  # no names claimed at registration: collect() runs at scrape time only
