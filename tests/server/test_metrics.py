"""The server's /metrics, read over real HTTP and parsed with prometheus_client's own parser, after a real
speculative generation (the client's loop) and a plain-API request: vLLM's names and labels, and they move."""
from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgespec.proto.edgespec.v1 import pb
from support.servers import running_server
from support.streams import ServerStream

SERVED = "tiny-served"
VLLM_NAMES = {  # family -> type, as vLLM exports them (with vllm: for edgespec:)
    "edgespec:spec_decode_num_drafts": "counter", "edgespec:spec_decode_num_draft_tokens": "counter",
    "edgespec:spec_decode_num_accepted_tokens": "counter",
    "edgespec:spec_decode_num_accepted_tokens_per_pos": "counter",
    "edgespec:time_to_first_token_seconds": "histogram", "edgespec:e2e_request_latency_seconds": "histogram",
    "edgespec:request_queue_time_seconds": "histogram", "edgespec:verify_time_seconds": "histogram",
    "edgespec:num_requests_running": "gauge", "edgespec:num_requests_waiting": "gauge",
    "edgespec:kv_cache_usage_perc": "gauge",
    # the rest of vLLM's Grafana dashboard's panels
    "edgespec:prompt_tokens": "counter", "edgespec:generation_tokens": "counter",
    "edgespec:request_success": "counter", "edgespec:inter_token_latency_seconds": "histogram",
    "edgespec:request_time_per_output_token_seconds": "histogram", "edgespec:request_prompt_tokens": "histogram",
    "edgespec:request_generation_tokens": "histogram", "edgespec:request_max_num_generation_tokens": "histogram",
    "edgespec:request_params_max_tokens": "histogram",
    "edgespec:request_prefill_time_seconds": "histogram", "edgespec:request_decode_time_seconds": "histogram",
    "edgespec:request_inference_time_seconds": "histogram", "edgespec:spec_decode_acceptance_length": "histogram",
}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with running_server(tiny_model_dir, served_model_name=SERVED, max_kv_bytes=64 << 20,
                        max_context_tokens=512) as handle:
        yield handle


def scrape(server) -> tuple[dict, dict]:
    """(family name -> type, (sample name, labels without model_name/engine) -> value); checks the labels."""
    text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    types, values = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            assert not s.name.endswith("_created"), s.name
            if s.name.startswith("edgespec:"):  # vLLM's names carry vLLM's labels
                assert s.labels.get("model_name") == SERVED and s.labels.get("engine") == "0", s
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))
            values[(s.name, rest)] = s.value
    return types, values


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_names_labels_and_counts_follow_a_real_generation(server, tiny_model_dir):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig
    from edgespec.client.loop.generation import GenerationConfig

    _, before = scrape(server)
    # The target's own weights as the drafter: long accepted paths, so per-position counters move.
    options = DrafterOptions(name="independent", model=str(tiny_model_dir), dtype="float32")
    with EdgespecClient(ClientConfig(LinkConfig(server.address), options, tokenizer=str(tiny_model_dir))) as client:
        assert client.model_name == SERVED
        client_ids = client.encode("def add(a, b):\n")
        result = client.generate(client_ids, GenerationConfig(max_new_tokens=24, ignore_eos=True))
    m = result.metrics
    assert m.num_drafts >= 2 and m.num_accepted_tokens >= 2
    api = httpx.post(f"{server.http_url}/v1/completions", json={"prompt": "x = ", "max_tokens": 3,
                                                                 "temperature": 0}, timeout=60)
    assert api.status_code == 200
    api_usage = api.json()["usage"]
    types, after = scrape(server)

    for name, kind in VLLM_NAMES.items():
        assert types.get(name) == kind, (name, types.get(name))
    assert delta(before, after, "edgespec:spec_decode_num_drafts_total") == m.num_drafts
    assert delta(before, after, "edgespec:spec_decode_num_draft_tokens_total") == m.num_draft_tokens
    assert delta(before, after, "edgespec:spec_decode_num_accepted_tokens_total") == m.num_accepted_tokens
    per_pos = [delta(before, after, "edgespec:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(len(m.accepted_per_position) + 1)]
    assert per_pos == [*m.accepted_per_position, 0]  # position 0 = the first drafted token, as in vLLM
    # One session (Open .. Close) and one plain-API request: each has a first token and an end.
    assert delta(before, after, "edgespec:time_to_first_token_seconds_count") == 2
    assert delta(before, after, "edgespec:e2e_request_latency_seconds_count") == 2
    drafts_sent = m.calls - 1 - m.resumes  # Draft messages: every call but the Open
    assert drafts_sent >= 1 and delta(before, after, "edgespec:verify_time_seconds_count") == drafts_sent
    assert delta(before, after, "edgespec:request_queue_time_seconds_count") == m.calls  # Open and Drafts
    # Mean acceptance length, chain-equivalent: the histogram's mean is 1 + accepted / drafts.
    assert delta(before, after, "edgespec:spec_decode_acceptance_length_count") == m.num_drafts
    assert delta(before, after, "edgespec:spec_decode_acceptance_length_sum") == m.num_drafts + m.num_accepted_tokens
    # Requests: both ran to their length (ignore_eos; 3 tokens of the plain API unless an EOS came first).
    assert sum(delta(before, after, "edgespec:request_success_total", finished_reason=r)
               for r in ("stop", "length", "abort")) == 2
    assert delta(before, after, "edgespec:request_success_total", finished_reason="abort") == 0
    assert delta(before, after, "edgespec:prompt_tokens_total") == len(client_ids) + api_usage["prompt_tokens"]
    generated = m.new_tokens + api_usage["completion_tokens"]
    assert delta(before, after, "edgespec:generation_tokens_total") == generated
    assert delta(before, after, "edgespec:request_generation_tokens_sum") == generated
    assert delta(before, after, "edgespec:request_prompt_tokens_count") == 2
    assert delta(before, after, "edgespec:request_max_num_generation_tokens_sum") == generated  # one sequence each
    assert delta(before, after, "edgespec:request_params_max_tokens_sum") == 24 + 3
    # One inter-token observation per answer after the first: the session's Drafts, the plain API's tokens.
    assert delta(before, after, "edgespec:inter_token_latency_seconds_count") == (
        drafts_sent + api_usage["completion_tokens"] - 1)
    assert delta(before, after, "edgespec:request_time_per_output_token_seconds_count") == 2
    assert after[("edgespec:num_requests_running", ())] == 0  # the session was closed
    assert after[("edgespec:num_requests_waiting", ())] == 0
    assert after[("edgespec:time_to_first_token_seconds_sum", ())] > before.get(
        ("edgespec:time_to_first_token_seconds_sum", ()), 0.0)


def test_running_and_kv_usage_follow_an_open_session(server, fingerprint):
    import grpc

    with grpc.insecure_channel(server.address) as channel, ServerStream(channel) as stream:
        opened = stream.send(open=pb.Open(prompt_ids=list(range(3, 40)), tokenizer_fingerprint=fingerprint,
                                          max_new_tokens=8)).opened
        _, during = scrape(server)
        assert during[("edgespec:num_requests_running", ())] == 1
        assert 0 < during[("edgespec:kv_cache_usage_perc", ())] < 1  # some KV of a 64 MiB budget
        stream.send(close=pb.Close(session_id=opened.session_id))
    _, after = scrape(server)
    assert after[("edgespec:num_requests_running", ())] == 0
    assert after[("edgespec:kv_cache_usage_perc", ())] == 0


def test_a_draft_is_a_tree_with_nodes_whichever_message_carries_it(server, fingerprint):
    """Open with a tree, a Draft with an empty tree, a Draft with a tree: two drafts (vLLM's meaning), two
    verifications timed (the Drafts), and a session dropped by its TTL is an aborted request."""
    import grpc

    from edgespec.shared.tree import ROOT, DraftTree, encode_tree

    _, before = scrape(server)
    tree = encode_tree(DraftTree((5, 6, 7), (ROOT, 0, ROOT)))
    with grpc.insecure_channel(server.address) as channel, ServerStream(channel) as stream:
        opened = stream.send(open=pb.Open(prompt_ids=list(range(3, 20)), tokenizer_fingerprint=fingerprint,
                                          max_new_tokens=50, tree=tree)).opened
        sid, committed = opened.session_id, opened.committed_len
        empty = stream.send(draft=pb.Draft(session_id=sid, step=1, committed_len=committed)).verified
        full = stream.send(draft=pb.Draft(session_id=sid, step=2, committed_len=empty.committed_len, tree=tree))
        accepted = len(opened.accepted) + len(full.verified.accepted)
        stream.send(close=pb.Close(session_id=sid))
    _, after = scrape(server)
    assert delta(before, after, "edgespec:spec_decode_num_drafts_total") == 2
    assert delta(before, after, "edgespec:spec_decode_num_draft_tokens_total") == 6
    assert delta(before, after, "edgespec:spec_decode_num_accepted_tokens_total") == accepted
    assert delta(before, after, "edgespec:spec_decode_acceptance_length_count") == 2
    assert delta(before, after, "edgespec:verify_time_seconds_count") == 2
    assert delta(before, after, "edgespec:generation_tokens_total") == full.verified.committed_len - 17
    assert delta(before, after, "edgespec:request_success_total", finished_reason="stop") == 1


def test_a_dropped_session_is_an_aborted_request(tiny_model_dir, fingerprint):
    import grpc

    with running_server(tiny_model_dir, session_ttl_s=0.3, max_context_tokens=128) as handle:
        with grpc.insecure_channel(handle.address) as channel, ServerStream(channel) as stream:
            stream.send(open=pb.Open(prompt_ids=[3, 4, 5], tokenizer_fingerprint=fingerprint, max_new_tokens=8))
        import time

        deadline = time.monotonic() + 10
        while len(handle.core.store) and time.monotonic() < deadline:
            handle.core.store.expire()
            time.sleep(0.1)
        registry = handle.core.metrics.registry
        assert registry.get_sample_value("edgespec:request_success_total", {"finished_reason": "abort"}) == 1
        assert registry.get_sample_value("edgespec:e2e_request_latency_seconds_count") == 1


def test_the_cost_curve_measured_at_start_is_not_traffic(tiny_model_dir):
    """The server verifies a throwaway session at start (its cost curve for Info): no metric and no prefix
    cache entry may show it."""
    with running_server(tiny_model_dir, max_context_tokens=128) as handle:
        assert handle.core.cost_curve is not None and handle.core.cost_curve.nodes
        registry = handle.core.metrics.registry
        for name in ("edgespec:e2e_request_latency_seconds_count", "edgespec:spec_decode_num_drafts_total",
                     "edgespec:prompt_tokens_total", "edgespec_sessions_opened_total"):
            assert not registry.get_sample_value(name), name
        assert handle.core.prefix_cache is not None and len(handle.core.prefix_cache) == 0


def test_engine_step_parts_count_every_step_of_a_plain_request(server):
    """The step's parts move with the steps run: a plain-API request of 3 tokens runs at least 3 steps, and every
    part (the forward alone included) adds time; the parts are counters."""
    types, before = scrape(server)
    assert types.get("edgespec_engine_step_seconds") == "counter" and types.get("edgespec_engine_steps") == "counter"
    api = httpx.post(f"{server.http_url}/v1/completions", json={"prompt": "y = ", "max_tokens": 3, "temperature": 0,
                                                                 "ignore_eos": True}, timeout=60)
    assert api.status_code == 200
    _, after = scrape(server)
    assert delta(before, after, "edgespec_engine_steps_total") >= 3
    for part in ("pack", "launch", "device"):
        assert delta(before, after, "edgespec_engine_step_seconds_total", part=part) > 0, part
