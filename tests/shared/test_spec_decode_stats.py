"""The spec-decode stats type counts acceptance per position (vLLM's observe_draft), for both sides' metrics."""
from __future__ import annotations

from prometheus_client import CollectorRegistry

from edgespec.shared.metrics import GenerationMetrics, SpecDecodeStats
from edgespec.shared.prom import SpecDecodeCounters


def test_observe_draft_counts_each_position_reached():
    stats = SpecDecodeStats()
    for nodes, accepted in ((8, 3), (8, 0), (5, 1), (12, 5)):
        stats.observe_draft(nodes, accepted)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (4, 33, 9)
    assert stats.accepted_per_position == [3, 2, 2, 1, 1]  # position 0: drafts that accepted at least one
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    assert stats.acceptance_length == (9 + 4) / 4
    assert SpecDecodeStats().acceptance_length == 0.0


def test_the_prometheus_sink_reads_the_stats():
    registry = CollectorRegistry()
    counters = SpecDecodeCounters(registry)
    metrics = GenerationMetrics()
    metrics.observe_draft(6, 2)
    metrics.observe_draft(6, 1)
    counters.observe(metrics)
    value = registry.get_sample_value
    assert value("edgespec:spec_decode_num_drafts_total") == 2
    assert value("edgespec:spec_decode_num_draft_tokens_total") == 12
    assert value("edgespec:spec_decode_num_accepted_tokens_total") == 3
    assert [value("edgespec:spec_decode_num_accepted_tokens_per_pos_total", {"position": p}) for p in "01"] == [2, 1]
    assert value("edgespec:spec_decode_num_accepted_tokens_per_pos_total", {"position": "2"}) is None
