"""The client's metrics (client serve's /metrics) fed by real generations against a real tiny server."""
from __future__ import annotations

import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from edgespec.client.loop.generation import GenerationConfig
from edgespec.client.metrics import ClientMetrics

P = "edgespec_client:"  # the client's series; the server's are edgespec:


def values(metrics: ClientMetrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            assert not s.name.endswith("_created"), s.name
            assert s.labels.get("model_name") == metrics.model_name and s.labels.get("engine") == "0", s
            out[(s.name, s.labels.get("position"))] = s.value
    return out


def test_counters_and_histograms_follow_generations(tiny_server, make_client, tiny_model_dir):
    client = make_client(tiny_server.address, "independent", drafter_dir=tiny_model_dir)  # the target as drafter
    client.metrics = metrics = ClientMetrics(client.model_name)
    ids = client.encode("def add(a, b):\n")
    first = client.generate(ids, GenerationConfig(max_new_tokens=20, ignore_eos=True))
    second = [x for x in client.stream(ids, GenerationConfig(max_new_tokens=8, ignore_eos=True))][-1]
    v = values(metrics)
    m1, m2 = first.metrics, second.metrics
    assert m1.num_accepted_tokens >= 2
    assert v[(P + "spec_decode_num_drafts_total", None)] == m1.num_drafts + m2.num_drafts
    assert v[(P + "spec_decode_num_draft_tokens_total", None)] == m1.num_draft_tokens + m2.num_draft_tokens
    assert v[(P + "spec_decode_num_accepted_tokens_total", None)] == (m1.num_accepted_tokens
                                                                          + m2.num_accepted_tokens)
    for pos, count in enumerate(m1.accepted_per_position):
        other = m2.accepted_per_position[pos] if pos < len(m2.accepted_per_position) else 0
        assert v[(P + "spec_decode_num_accepted_tokens_per_pos_total", str(pos))] == count + other
    # The chain-equivalent figure: tokens each draft committed, bonus included; its mean is 1 + accepted / drafts.
    drafts, accepted = m1.num_drafts + m2.num_drafts, m1.num_accepted_tokens + m2.num_accepted_tokens
    assert v[(P + "spec_decode_acceptance_length_count", None)] == drafts
    assert v[(P + "spec_decode_acceptance_length_sum", None)] == drafts + accepted
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_verify_time_seconds"):
        assert v[(f"{P}{name}_count", None)] == 2, name
    # every message answered (Open, Draft, Resume and the Close, which is no call to the model)
    assert v[(P + "round_trip_time_seconds_count", None)] == len(m1.round_trips_s) + len(m2.round_trips_s)
    assert len(m1.round_trips_s) > m1.calls
    assert v[(P + "generation_tokens_total", None)] == 28
    for name, field in (("draft_ahead_guesses", "guesses"), ("draft_ahead_hits", "guess_hits"),
                        ("draft_ahead_stopped", "stopped_ahead")):
        assert v[(f"{P}{name}_total", None)] == getattr(m1, field) + getattr(m2, field), name
    assert v[(P + "prompt_tokens_total", None)] == 2 * len(ids)
    assert v[(P + "num_requests_running", None)] == 0 and v[(P + "num_requests_waiting", None)] == 0
    assert v[(P + "e2e_request_latency_seconds_sum", None)] >= v[(P + "time_to_first_token_seconds_sum",
                                                                        None)]


def test_a_second_request_waits_while_one_runs_and_an_abandoned_one_leaves_the_gauges(tiny_server, make_client):
    client = make_client(tiny_server.address, "ngram")
    client.metrics = metrics = ClientMetrics(client.model_name)
    ids = client.encode("x = 1\n")
    running = client.stream(ids, GenerationConfig(max_new_tokens=30, ignore_eos=True))
    next(running)  # holds the client now
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (client.generate(ids, GenerationConfig(max_new_tokens=3)), done.set()))
    waiter.start()
    deadline = time.monotonic() + 10
    while values(metrics)[(P + "num_requests_waiting", None)] != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    v = values(metrics)
    assert v[(P + "num_requests_waiting", None)] == 1 and v[(P + "num_requests_running", None)] == 1
    running.close()  # abandoned mid-way: it leaves the gauges and frees the client
    waiter.join(timeout=60)
    assert done.is_set()
    v = values(metrics)
    assert v[(P + "num_requests_running", None)] == 0 and v[(P + "num_requests_waiting", None)] == 0
    assert v[(P + "request_queue_time_seconds_count", None)] == 2
    assert v[(P + "e2e_request_latency_seconds_count", None)] == 1  # only the finished one


def test_plain_and_queued_steps_are_counted(tiny_server, make_client):
    import dataclasses

    from support.estimates import TreesNeverPay

    from edgespec.client.loop.planner import LoopConfig

    client = make_client(tiny_server.address, "ngram")
    client.config = dataclasses.replace(client.config, loop=LoopConfig())  # trees sized each step, or none
    client.metrics = metrics = ClientMetrics(client.model_name)
    client.estimates = TreesNeverPay()  # plain steps, queued behind each other
    r = client.generate(client.encode("x = 1\n"), GenerationConfig(max_new_tokens=40, ignore_eos=True))
    v = values(metrics)
    assert r.metrics.queued_steps >= 2 and r.metrics.plain_steps > r.metrics.queued_steps
    assert v[(P + "plain_steps_total", None)] == r.metrics.plain_steps
    assert v[(P + "queued_steps_total", None)] == r.metrics.queued_steps


def scrape(url: str) -> dict:
    """client serve's /metrics over HTTP, as Prometheus reads it: (name, state label) -> value."""
    import httpx

    reply = httpx.get(f"{url}/metrics", timeout=30)
    assert reply.status_code == 200
    return {(s.name, s.labels.get("state")): s.value
            for family in text_string_to_metric_families(reply.text) for s in family.samples}


def test_client_serve_exports_the_link_series(tiny_server, relay, make_client, tiny_model_dir):
    """Calls to the server, bytes, online and offline tokens, disconnects, resumes and the link's state, on client
    serve's /metrics over real HTTP, through a relay that really cuts the link."""
    import httpx

    from edgespec.client.http_api import build_app
    from edgespec.client.http_health import LinkProbe
    from edgespec.shared.wire import ResumePolicy
    from edgespec.client.loop.generation import TokenEvent, TokenOrigin
    from support.asgi_server import serving

    client = make_client(relay.target, "independent", drafter_dir=tiny_model_dir)  # can go on offline
    client.metrics = metrics = ClientMetrics(client.model_name)
    probe = LinkProbe(client.config.link, timeout_s=0.5, max_age_s=0)
    with serving(build_app(client, metrics=metrics, probe=probe)) as url:
        v = scrape(url)
        assert v[(P + "link_state", "up")] == 1 and v[(P + "link_state", "down")] == 0
        assert v[(P + "server_calls_total", None)] == 0
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "def add(a, b):\n", "max_tokens": 12,
                                                           "temperature": 0, "ignore_eos": True}, timeout=60).json()
        m = answer["edgespec"]
        v = scrape(url)
        assert m["calls"] >= 1 and v[(P + "server_calls_total", None)] == m["calls"]
        assert v[(P + "link_sent_bytes_total", None)] == m["bytes_up"] > 0
        assert v[(P + "link_received_bytes_total", None)] == m["bytes_down"] > 0
        assert v[(P + "online_tokens_total", None)] == 12 and v[(P + "offline_tokens_total", None)] == 0

        # A generation whose link is blackholed after 5 tokens and comes back after 3 offline tokens: the client
        # goes offline, resumes, and keeps its offline text (keep policy), which the counters show.
        ids = client.encode("def add(a, b):\n    return a + b\n")
        offline = 0
        for item in client.stream(ids, GenerationConfig(max_new_tokens=30, ignore_eos=True, offline_wait_s=20,
                                                        resume_policy=ResumePolicy.KEEP)):
            if isinstance(item, TokenEvent):
                if item.index == 4 and relay.state == "up":
                    relay.cut("blackhole")
                if item.origin is TokenOrigin.OFFLINE:
                    offline += 1
                    time.sleep(0.02)
                    if offline == 3:
                        relay.restore()
        result = item
        assert result.metrics.disconnects >= 1 and result.metrics.resumes >= 1 and offline >= 3
        v = scrape(url)
        assert v[(P + "link_disconnects_total", None)] == result.metrics.disconnects
        assert v[(P + "link_resumes_total", None)] == result.metrics.resumes
        assert v[(P + "offline_tokens_total", None)] == result.metrics.offline_tokens
        assert v[(P + "server_calls_total", None)] == m["calls"] + result.metrics.calls

        relay.cut("reset")  # the server cannot be reached now
        try:
            v = scrape(url)
            assert v[(P + "link_state", "down")] == 1 and v[(P + "link_state", "up")] == 0
        finally:
            relay.restore()
