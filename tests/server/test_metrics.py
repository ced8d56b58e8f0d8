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
    from edgespec.client.generation import GenerationConfig
    from edgespec.client.link import LinkConfig

    _, before = scrape(server)
    # The target's own weights as the drafter: long accepted paths, so per-position counters move.
    options = DrafterOptions(name="independent", model=str(tiny_model_dir), dtype="float32")
    with EdgespecClient(ClientConfig(LinkConfig(server.address), options, tokenizer=str(tiny_model_dir))) as client:
        assert client.model_name == SERVED
        result = client.generate(client.encode("def add(a, b):\n"), GenerationConfig(max_new_tokens=24,
                                                                                      ignore_eos=True))
    m = result.metrics
    assert m.num_drafts >= 2 and m.num_accepted_tokens >= 2
    api = httpx.post(f"{server.http_url}/v1/completions", json={"prompt": "x = ", "max_tokens": 3,
                                                                 "temperature": 0}, timeout=60)
    assert api.status_code == 200
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
    verifications = delta(before, after, "edgespec_verifications_total")
    assert verifications >= 1 and delta(before, after, "edgespec:verify_time_seconds_count") == verifications
    assert delta(before, after, "edgespec:request_queue_time_seconds_count") == verifications + 1  # + the Open
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
