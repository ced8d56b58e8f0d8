"""The local OpenAI-compatible API, driven by the real `openai` client over real HTTP."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest



@pytest.fixture(scope="module")
def api(tiny_server, tiny_model_dir, tiny_drafter_dir):
    import uvicorn

    from edgespec.client.api import build_app
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link import LinkConfig

    client = EdgespecClient(ClientConfig(LinkConfig(tiny_server.address),
                                         DrafterOptions("independent", model=str(tiny_drafter_dir), dtype="float32"),
                                         tokenizer=str(tiny_model_dir)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(client, default_max_tokens=40), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield client, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)
    client.close()


@pytest.fixture(scope="module")
def openai_client(api):
    import openai

    return openai.OpenAI(base_url=api[1], api_key="unused", max_retries=0, timeout=60)


def test_models(openai_client, api):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [api[0].model_name]


def test_completion_plain_and_streamed_agree(openai_client, api, tiny_target_f32, greedy):
    client = api[0]
    prompt = "def add(a, b):\n    return a + b\n"
    ids = client.encode(prompt)
    want_ids = greedy(tiny_target_f32, ids, 24, client.tokens.eos_ids)
    want = client.decode(want_ids)
    done = openai_client.completions.create(model=client.model_name, prompt=prompt, max_tokens=24)
    assert done.choices[0].text == want
    assert done.usage.prompt_tokens == len(ids) and done.usage.completion_tokens == len(want_ids)
    extra = done.model_extra["edgespec"]
    assert extra["drafter"] == "independent" and extra["calls"] >= 1 and extra["new_tokens"] == len(want_ids)
    chunks = list(openai_client.completions.create(model=client.model_name, prompt=prompt, max_tokens=24,
                                                   stream=True))
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
    done = openai_client.chat.completions.create(model=client.model_name, messages=messages, max_tokens=30)
    assert done.choices[0].message.content == want and done.choices[0].message.role == "assistant"
    stream = openai_client.chat.completions.create(model=client.model_name, messages=messages, max_tokens=30,
                                                   stream=True)
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(parts) == want


def test_stop_string_is_not_in_the_text(openai_client, api, tiny_target_f32, greedy):
    client = api[0]
    prompt = "def add(a, b):\n"
    ids = client.encode(prompt)
    full = client.decode(greedy(tiny_target_f32, ids, 30, set()))
    stop = full[8:10]
    want = full[: full.index(stop)]
    done = openai_client.completions.create(model=client.model_name, prompt=prompt, max_tokens=30, stop=stop)
    assert done.choices[0].text == want and done.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in openai_client.completions.create(
        model=client.model_name, prompt=prompt, max_tokens=30, stop=[stop], stream=True))
    assert streamed == want


def test_bad_requests_say_what_is_wrong(api):
    url = api[1]
    r = httpx.post(f"{url}/chat/completions", json={"messages": "hi"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/completions", json={"prompt": "x", "max_tokens": -3})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
