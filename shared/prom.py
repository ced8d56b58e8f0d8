"""Prometheus metrics under vLLM's names and semantics, for the server and `client serve`.

vLLM's series are ``vllm:<name>{model_name, engine}``. The server's are ``edgespec:<name>`` and
`client serve`'s ``edgespec_client:<name>``, with the same labels: the prefix says which side, so the
same tree is never counted twice by one query. A vLLM Grafana dashboard reads the server with one
relabelling rule on the server's scrape job (``metric_relabel_configs``: source ``__name__``, regex
``edgespec:(.*)``, replacement ``vllm:$1``; deploy/prometheus/prometheus.yml has it); the client's
series keep their own prefix and never reach those panels (relabel ``edgespec_client:(.*)`` the same
way in a dashboard of its own to see a laptop's view).

Spec decoding, as vLLM counts it, in the words ``shared.metrics`` defines (``SpecDecodeStats``):
``spec_decode_num_drafts_total``, ``spec_decode_num_draft_tokens_total`` (every branch counted, so accepted /
draft tokens is a tree's node acceptance, not a chain's), ``spec_decode_num_accepted_tokens_total``,
``spec_decode_num_accepted_tokens_per_pos_total{position}`` (position 0 is the first drafted token, as in
vLLM) and the ``spec_decode_acceptance_length`` histogram (tokens each draft committed, bonus included: its
mean is vLLM's mean acceptance length, whatever the tree's width).

``VllmMetrics`` renders ``model_name`` and ``engine`` on its prefix's series only, and without
prometheus_client's ``*_created`` series, which vLLM does not export either.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from .metrics import SpecDecodeStats

PREFIX = "edgespec:"  # the server's series (relabelled to vllm: for vLLM dashboards)
CLIENT_PREFIX = "edgespec_client:"  # `client serve`'s series: the same names, the laptop's side
ENGINE = "0"  # vLLM labels every series with its engine index; one process here is one engine

# vLLM's buckets for these histograms (TTFT; request latency and queue time), so panels line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
# One verification or one call: milliseconds on a GPU, seconds over a bad link.
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# vLLM's inter-token latency and time-per-output-token buckets.
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0)
# Tokens committed by one draft (bonus included): 1 .. a 255-node chain + 1.
ACCEPTANCE_LENGTH_BUCKETS = tuple(float(i) for i in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 64, 256))


def size_buckets(max_tokens: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 buckets up to a request's largest size (prompt or generation tokens)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_tokens:
                return tuple(float(b) for b in out) or (1.0,)
            out.append(m * scale)
        scale *= 10


class SpecDecodeCounters:
    """vLLM's four spec-decode counters and the acceptance-length histogram on a registry."""

    def __init__(self, registry: CollectorRegistry, prefix: str = PREFIX):
        self.drafts = Counter(prefix + "spec_decode_num_drafts",
                              "Number of spec decoding drafts: verified trees with at least one node.",
                              registry=registry)
        self.draft_tokens = Counter(prefix + "spec_decode_num_draft_tokens",
                                    "Number of draft tokens: tree nodes, every branch counted.", registry=registry)
        self.accepted_tokens = Counter(prefix + "spec_decode_num_accepted_tokens",
                                       "Number of accepted tokens (one path per tree).", registry=registry)
        self.accepted_per_pos = Counter(prefix + "spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position (depth in the tree).", ["position"],
                                        registry=registry)
        self.acceptance_length = Histogram(
            prefix + "spec_decode_acceptance_length",
            "Tokens committed per draft, bonus included (chain-equivalent: its mean is vLLM's mean acceptance "
            "length, 1 + accepted / drafts).", buckets=ACCEPTANCE_LENGTH_BUCKETS, registry=registry)

    def observe(self, stats: SpecDecodeStats) -> None:
        """Add drafts, as counted by the stats type."""
        self.drafts.inc(stats.num_drafts)
        self.draft_tokens.inc(stats.num_draft_tokens)
        self.accepted_tokens.inc(stats.num_accepted_tokens)
        for position, count in enumerate(stats.accepted_per_position):
            if count:
                self.accepted_per_pos.labels(position=str(position)).inc(count)
        for accepted, drafts in enumerate(stats.drafts_by_accepted()):
            for _ in range(drafts):
                self.acceptance_length.observe(accepted + 1)


class VllmMetrics:
    """The series the server and the client both have, on a registry of their own (several can share a
    process): vLLM's spec-decode counters, TTFT, end-to-end latency and queue time, and the running and
    waiting gauges (whose meaning each side says in ``running_help``)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, running_help: str, prefix: str = PREFIX):
        self.model_name = model_name  # the label on every series; read per render: the client's is known once loaded
        self.prefix = prefix  # PREFIX on the server, CLIENT_PREFIX in `client serve`
        self.registry = r = CollectorRegistry()
        self.spec_decode = SpecDecodeCounters(r, prefix)
        self.ttft = Histogram(prefix + "time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram(prefix + "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             buckets=REQUEST_BUCKETS, registry=r)
        self.queue_time = Histogram(prefix + "request_queue_time_seconds",
                                    "Histogram of time spent waiting in the queue in seconds.", buckets=STEP_BUCKETS,
                                    registry=r)
        self.running = Gauge(prefix + "num_requests_running", running_help, registry=r)
        self.waiting = Gauge(prefix + "num_requests_waiting", "Number of requests waiting to be processed.", registry=r)

    def collect(self):
        vllm = {"model_name": self.model_name or "", "engine": ENGINE}
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            # vLLM's labels on vLLM's names only: edgespec's own series keep the shape their readers parse.
            labels = vllm if family.name.startswith(self.prefix) else {}
            created = family.name + "_created"
            for s in family.samples:
                if s.name != created:
                    out.add_sample(s.name, {**labels, **s.labels}, s.value, s.timestamp, s.exemplar)
            yield out

    def render(self) -> bytes:
        return generate_latest(self)
