"""The metrics types: a generation's derived figures, and the spec-decode stats counting acceptance per position
(vLLM's observe_draft) for both sides' metrics."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from edgespec.shared.metrics import GenerationMetrics, LinkTraffic, SpecDecodeStats
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


def test_generations_add_up_field_by_field_and_position_by_position():
    a, b = GenerationMetrics(drafter="ngram", new_tokens=10, wall_s=1.0), GenerationMetrics(new_tokens=5, wall_s=0.5)
    a.observe_draft(8, 3)
    b.observe_draft(8, 1)
    b.observe_draft(8, 0)
    b.round_trips_s.append(0.02)
    a.add(b)
    assert (a.drafter, a.new_tokens, a.wall_s, a.num_drafts, a.num_accepted_tokens) == ("ngram", 15, 1.5, 3, 4)
    assert a.accepted_per_position == [2, 1, 1] and a.round_trips_s == [0.02]
    assert a.acceptance_length == (4 + 3) / 3
    traffic = LinkTraffic(calls=2, bytes_up=100, round_trips_s=[0.1, 0.2])
    a.add(traffic)  # a session's traffic into its generation
    assert (a.calls, a.bytes_up, a.round_trips_s, a.num_drafts) == (2, 100, [0.02, 0.1, 0.2], 3)


def test_an_empty_tree_is_a_verification_not_a_draft():
    """vLLM counts steps with draft tokens; tau (per verification) still counts the empty tree's bonus token."""
    stats = SpecDecodeStats()
    stats.observe_draft(0, 0)  # an ngram drafter with nothing to propose
    stats.observe_draft(8, 3)
    assert (stats.num_drafts, stats.num_verifications, stats.num_draft_tokens) == (1, 2, 8)
    assert stats.mean_acceptance_length == 4.0  # 1 + 3 / 1: vLLM's, chain-equivalent
    assert stats.acceptance_length == (3 + 2) / 2  # tau: tokens per verification
    assert stats.drafts_by_accepted() == [0, 0, 0, 1]


def test_the_request_summary_speaks_vllm_and_sglang():
    stats = SpecDecodeStats()
    for nodes, accepted in ((16, 4), (16, 2), (0, 0)):
        stats.observe_draft(nodes, accepted)
    s = stats.request_summary()
    assert (s["num_drafts"], s["num_draft_tokens"], s["num_accepted_tokens"]) == (2, 32, 6)
    assert s["num_accepted_tokens_per_pos"] == [2, 2, 1, 1] and s["spec_verify_ct"] == 3
    assert s["spec_accept_length"] == s["mean_acceptance_length"] == 4.0  # 1 + 6 / 2
    assert s["spec_accept_rate"] == round(6 / 32, 4)  # nodes counted: low for a wide tree
    assert SpecDecodeStats().request_summary()["spec_accept_length"] == 0.0


def test_the_histogram_sink_observes_each_draft_once():
    registry = CollectorRegistry()
    counters = SpecDecodeCounters(registry)
    stats = SpecDecodeStats()
    for nodes, accepted in ((6, 2), (6, 0), (0, 0), (6, 5)):
        stats.observe_draft(nodes, accepted)
    counters.observe(stats)
    value = registry.get_sample_value
    assert value("edgespec:spec_decode_num_drafts_total") == 3
    assert value("edgespec:spec_decode_acceptance_length_count") == 3
    assert value("edgespec:spec_decode_acceptance_length_sum") == 3 + 2 + 0 + 5


def test_metrics_derived_figures():
    m = GenerationMetrics(new_tokens=30, num_drafts=8, num_verifications=10, num_accepted_tokens=19, calls=11,
                          bytes_up=600, bytes_down=300, wall_s=2.0)
    assert m.acceptance_length == pytest.approx(2.9)  # per verification, the 2 empty trees included
    assert m.mean_acceptance_length == pytest.approx(1 + 19 / 8)  # vLLM's, per draft
    assert m.tokens_per_s == 15
    assert m.calls_per_100_tokens == pytest.approx(100 * 11 / 30)
    assert m.bytes_per_token == 30
    d = m.to_dict()
    assert d["acceptance_length"] == 2.9 and "round_trips_s" not in d
    assert d["mean_acceptance_length"] == round(1 + 19 / 8, 4) and d["num_verifications"] == 10
    assert GenerationMetrics().acceptance_length == 0.0
