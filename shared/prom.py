"""Prometheus metrics under vLLM's names and semantics, shared by the server and `client serve`.

vLLM's series are ``vllm:<name>{model_name, engine}``; ours are ``edgespec:<name>`` with the same
labels, so a vLLM Grafana dashboard reads them with only the prefix changed:

- ``edgespec:spec_decode_num_drafts_total``: draft trees verified;
- ``edgespec:spec_decode_num_draft_tokens_total``: their nodes;
- ``edgespec:spec_decode_num_accepted_tokens_total``: nodes the target accepted;
- ``edgespec:spec_decode_num_accepted_tokens_per_pos_total{position}``: drafts whose accepted path
  reached depth position+1 (position 0 is the first drafted token, as in vLLM);
- ``edgespec:time_to_first_token_seconds``, ``edgespec:e2e_request_latency_seconds``,
  ``edgespec:request_queue_time_seconds`` (histograms);
- ``edgespec:num_requests_running``, ``edgespec:num_requests_waiting`` (gauges), and on the server
  ``edgespec:kv_cache_usage_perc`` (1 = 100 %).

``VllmMetrics`` holds the series both sides have and renders its registry with ``model_name`` and
``engine`` on every ``edgespec:`` series, set when the page is rendered (the client learns its model's
name only once it has reached the server), and without prometheus_client's ``*_created`` series, which vLLM does not export either.
edgespec's own ``edgespec_*`` series keep their labels as they were.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from .metrics import SpecDecodeStats

PREFIX = "edgespec:"
ENGINE = "0"  # vLLM labels every series with its engine index; one process here is one engine

# vLLM's buckets for these histograms (TTFT; request latency and queue time), so panels line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
# One verification or one call: milliseconds on a GPU, seconds over a bad link.
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class SpecDecodeCounters:
    """vLLM's four spec-decode counters on a registry."""

    def __init__(self, registry: CollectorRegistry):
        self.drafts = Counter(PREFIX + "spec_decode_num_drafts", "Number of spec decoding drafts.",
                              registry=registry)
        self.draft_tokens = Counter(PREFIX + "spec_decode_num_draft_tokens", "Number of draft tokens.",
                                    registry=registry)
        self.accepted_tokens = Counter(PREFIX + "spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                                       registry=registry)
        self.accepted_per_pos = Counter(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position.", ["position"], registry=registry)

    def observe(self, stats: SpecDecodeStats) -> None:
        """Add verifications, as counted by the stats type."""
        self.drafts.inc(stats.num_drafts)
        self.draft_tokens.inc(stats.num_draft_tokens)
        self.accepted_tokens.inc(stats.num_accepted_tokens)
        for position, count in enumerate(stats.accepted_per_position):
            if count:
                self.accepted_per_pos.labels(position=str(position)).inc(count)


class VllmMetrics:
    """The series the server and the client both have, on a registry of their own (several can share a
    process): vLLM's spec-decode counters, TTFT, end-to-end latency and queue time, and the running and
    waiting gauges (whose meaning each side says in ``running_help``)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, running_help: str):
        self.model_name = model_name  # the label on every series; read per render: the client's is known once loaded
        self.registry = r = CollectorRegistry()
        self.spec_decode = SpecDecodeCounters(r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             buckets=REQUEST_BUCKETS, registry=r)
        self.queue_time = Histogram(PREFIX + "request_queue_time_seconds",
                                    "Histogram of time spent waiting in the queue in seconds.", buckets=STEP_BUCKETS,
                                    registry=r)
        self.running = Gauge(PREFIX + "num_requests_running", running_help, registry=r)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Number of requests waiting to be processed.",
                             registry=r)

    def collect(self):
        vllm = {"model_name": self.model_name or "", "engine": ENGINE}
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            # vLLM's labels on vLLM's names only: edgespec's own series keep the shape their readers parse.
            labels = vllm if family.name.startswith(PREFIX) else {}
            created = family.name + "_created"
            for s in family.samples:
                if s.name != created:
                    out.add_sample(s.name, {**labels, **s.labels}, s.value, s.timestamp, s.exemplar)
            yield out

    def render(self) -> bytes:
        return generate_latest(self)
