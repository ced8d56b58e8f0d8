"""The local OpenAI-compatible API, driven by the real `openai` client over real HTTP."""
from __future__ import annotations

import time

import httpx
import pytest
from support.asgi_server import assert_calls_stopped, serving, slowed_calls
from support.servers import running_server


@pytest.fixture(scope="module")
def edge(tiny_server, tiny_model_dir, tiny_drafter_dir):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig

    client = EdgespecClient(ClientConfig(LinkConfig(tiny_server.address),
                                         DrafterOptions("independent", model=str(tiny_drafter_dir), dtype="float32"),
                                         tokenizer=str(tiny_model_dir)))
    yield client
    client.close()


@pytest.fixture(scope="module")
def api(edge):
    from edgespec.client.http_api import build_app

    with serving(build_app(edge, default_max_tokens=40)) as url:
        yield edge, f"{url}/v1"


@pytest.fixture(scope="module")
def openai_client(api):
    import openai

    return openai.OpenAI(base_url=api[1], api_key="unused", max_retries=0, timeout=60)


def test_models(openai_client, api):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [api[0].model_name]
    assert openai_client.models.retrieve(api[0].model_name).id == api[0].model_name


def test_completion_plain_and_streamed_agree(openai_client, api, tiny_target_f32, greedy):
    client = api[0]
    prompt = "def add(a, b):\n    return a + b\n"
    ids = client.encode(prompt)
    want_ids = greedy(tiny_target_f32, ids, 24, client.tokens.eos_ids)
    want = client.decode(want_ids)
    done = openai_client.completions.create(model=client.model_name, prompt=prompt, max_tokens=24, temperature=0)
    assert done.choices[0].text == want
    assert done.usage.prompt_tokens == len(ids) and done.usage.completion_tokens == len(want_ids)
    extra = done.model_extra["edgespec"]
    assert extra["drafter"] == "independent" and extra["calls"] >= 1 and extra["new_tokens"] == len(want_ids)
    chunks = list(openai_client.completions.create(model=client.model_name, prompt=prompt, max_tokens=24,
                                                   temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == len(want_ids)
    assert chunks[-1].model_extra["edgespec"]["new_tokens"] == len(want_ids)


def test_chat_plain_and_streamed_agree(openai_client, api, tiny_target_f32, greedy):
    client = api[0]
    messages = [{"role": "user", "content": "say hi"}]
    ids = client.encode_chat(messages)
    assert client.decode(ids).startswith("user\nsay hi")  # the target's chat template was applied
    want = client.decode(greedy(tiny_target_f32, ids, 30, client.tokens.eos_ids))
    done = openai_client.chat.completions.create(model=client.model_name, messages=messages, max_tokens=30,
                                                 temperature=0)
    assert done.choices[0].message.content == want and done.choices[0].message.role == "assistant"
    stream = openai_client.chat.completions.create(model=client.model_name, messages=messages, max_tokens=30,
                                                   temperature=0, stream=True)
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(parts) == want


def test_stop_string_is_not_in_the_text(openai_client, api, tiny_target_f32, greedy):
    client = api[0]
    prompt = "def add(a, b):\n"
    ids = client.encode(prompt)
    full = client.decode(greedy(tiny_target_f32, ids, 30, set()))
    stop = full[8:10]
    want = full[: full.index(stop)]
    done = openai_client.completions.create(model=client.model_name, prompt=prompt, max_tokens=30, stop=stop,
                                            temperature=0)
    assert done.choices[0].text == want and done.choices[0].finish_reason == "stop"
    assert done.model_extra["edgespec"]["new_tokens"] == done.usage.completion_tokens  # the loop ended there too
    streamed = "".join(c.choices[0].text for c in openai_client.completions.create(
        model=client.model_name, prompt=prompt, max_tokens=30, stop=[stop], temperature=0, stream=True))
    assert streamed == want


def test_n_choices_each_carry_their_metrics(openai_client, api):
    done = openai_client.completions.create(model=api[0].model_name, prompt="ab", max_tokens=6, temperature=1.5,
                                            seed=1, n=2)
    assert [c.index for c in done.choices] == [0, 1]
    extras = done.model_extra["edgespec"]
    assert len(extras) == 2 and sum(e["new_tokens"] for e in extras) == done.usage.completion_tokens


def test_bad_requests_say_what_is_wrong(api):
    url = api[1]
    r = httpx.post(f"{url}/chat/completions", json={"messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{url}/completions", json={"prompt": "x", "max_tokens": -3})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/completions", json={"prompt": "x", "max_tokens": 0})  # was quietly 512 tokens
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(f"{url}/completions", json={"prompt": "x", "temperature": -1})  # was a 502 from the server
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(f"{url}/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_an_unknown_model_name_is_404(api):
    r = httpx.post(f"{api[1]}/completions", json={"model": "gpt-4o", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_the_key_is_checked_before_anything_else_and_metrics_can_ask_for_it(edge):
    from prometheus_client import CollectorRegistry, Counter

    from edgespec.client.http_api import build_app

    registry = CollectorRegistry()
    Counter("edgespec_test_requests", "a series of the test's own", registry=registry).inc()
    with serving(build_app(edge, api_key="k3y", metrics=registry)) as url:
        assert httpx.post(f"{url}/v1/completions", json={"prompt": 5}).status_code == 401
        assert httpx.get(f"{url}/v1/models").status_code == 401  # was open to anyone
        for headers in ({"Authorization": "Bearer k3y"}, {"authorization": "bearer k3y"}, {"x-api-key": "k3y"}):
            reply = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=headers)
            assert reply.status_code == 200, headers
        assert "edgespec_test_requests_total 1.0" in httpx.get(f"{url}/metrics").text  # open unless asked
    with serving(build_app(edge, api_key="k3y", metrics=registry, metrics_need_key=True)) as url:
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert httpx.get(f"{url}/metrics", headers={"x-api-key": "k3y"}).status_code == 200
    with serving(build_app(edge)) as url:
        assert httpx.get(f"{url}/metrics").status_code == 404  # no page given


def test_a_body_over_the_limit_is_413(edge):
    from edgespec.client.http_api import build_app

    with serving(build_app(edge, max_body_bytes=1000)) as url:
        reply = httpx.post(f"{url}/v1/completions", json={"prompt": "x" * 2000})
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"


def test_a_non_streaming_generation_stops_when_its_caller_disconnects(api, tiny_server, monkeypatch):
    edge, url = api
    calls = slowed_calls(monkeypatch, edge.drafter, "propose", 0.05)
    # ignore_eos: a sampled text's EOS depends on the trees the loop sent, which its estimates pick
    body = {"prompt": "def f(x):", "max_tokens": 400, "temperature": 1.0, "seed": 1, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/completions", json=body, timeout=0.5)
    assert_calls_stopped(calls)
    end = time.monotonic() + 5
    while len(tiny_server.core.store) and time.monotonic() < end:
        time.sleep(0.05)
    assert len(tiny_server.core.store) == 0  # the session was closed on the server


def test_a_server_at_capacity_is_429(tiny_model_dir):
    import queue

    import grpc

    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.http_api import build_app
    from edgespec.client.link.grpc_transport import LinkConfig
    from edgespec.proto.edgespec.v1 import pb, pb_grpc

    with running_server(tiny_model_dir, http_port=None, max_sessions=1) as server:
        edge = EdgespecClient(ClientConfig(LinkConfig(server.address), DrafterOptions("ngram"),
                                           tokenizer=str(tiny_model_dir)))
        channel = grpc.insecure_channel(server.address)
        requests: queue.Queue = queue.Queue()
        replies = pb_grpc.VerifierStub(channel).Session(iter(requests.get, None))
        requests.put(pb.ClientMessage(open=pb.Open(session_id="holder", prompt_ids=[1, 2],
                                                   tokenizer_fingerprint=edge.info.tokenizer_fingerprint)))
        assert next(replies).HasField("opened")  # the one session the server holds
        try:
            with serving(build_app(edge)) as url:
                reply = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
                assert reply.status_code == 429, reply.text
                assert "capacity" in reply.json()["error"]["message"]
        finally:
            requests.put(None)
            replies.cancel()
            channel.close()
            edge.close()
