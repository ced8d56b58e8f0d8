"""The HTTP side: health, Prometheus metrics, and the OpenAI-compatible plain API driven by the openai client."""
from __future__ import annotations

import time

import httpx
import pytest
from support.asgi_server import assert_calls_stopped, slowed_calls
from support.asgi_server import serving as serving_app

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.tree import ROOT, DraftTree, encode_tree


@pytest.fixture
def openai_client(tiny_server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{tiny_server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def model(tiny_server) -> str:
    return tiny_server.core.target.name


def serving(state, core):
    """build_http_app(state) with the tiny server's core, on a loopback port of its own."""
    from edgespec.server.http_api import build_http_app

    state.core = core
    return serving_app(build_http_app(state))


def until_eos(ids: list[int], eos: int = 258) -> list[int]:
    return ids[:ids.index(eos)] if eos in ids else ids


def test_health_says_ok_with_the_model(tiny_server):
    reply = httpx.get(f"{tiny_server.http_url}/health")
    assert reply.status_code == 200
    assert reply.json()["status"] == "ok" and reply.json()["model"] == tiny_server.core.target.name


def test_metrics_count_verifications_and_bytes(tiny_server, open_stream, fingerprint):
    stream = open_stream()
    stream.send(open=pb.Open(session_id="metrics-1", prompt_ids=[1, 2], tokenizer_fingerprint=fingerprint))
    stream.send(draft=pb.Draft(session_id="metrics-1", step=1, committed_len=3,
                               tree=encode_tree(DraftTree((4, 5), (ROOT, ROOT)))))
    text = httpx.get(f"{tiny_server.http_url}/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    values = {k.split("{")[0]: v for k, v in values.items()}
    assert values["edgespec:spec_decode_num_drafts_total"] >= 1
    assert values["edgespec:spec_decode_num_draft_tokens_total"] >= 2
    assert values["edgespec_bytes_in_total"] > 0 and values["edgespec_bytes_out_total"] > 0
    assert values["edgespec:spec_decode_acceptance_length_count"] >= 1
    assert values["edgespec:verify_time_seconds_count"] >= 1
    assert "edgespec_sessions" in values


def test_completions_with_token_ids_equal_the_target_greedy_output(openai_client, model, greedy_reference,
                                                                   tiny_target):
    prompt = [104, 105, 32, 116]
    reply = openai_client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
    out = greedy_reference(prompt, 24)
    truth = until_eos(out)
    # usage counts every token generated, the EOS that ended the text included
    assert reply.usage.completion_tokens == min(len(truth) + 1, 24) and reply.usage.prompt_tokens == 4
    assert reply.choices[0].text == tiny_target.tokenizer.decode(truth, skip_special_tokens=True)
    assert reply.choices[0].finish_reason == ("stop" if 258 in out else "length")


def test_streamed_completion_equals_the_whole_one(openai_client, model):
    kwargs = dict(model=model, prompt="def add(a, b):", max_tokens=20, temperature=0)
    whole = openai_client.completions.create(**kwargs).choices[0].text
    chunks = list(openai_client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_chat_completions_stream_and_whole(openai_client, model, tiny_target, greedy_reference):
    messages = [{"role": "user", "content": "hello"}]
    whole = openai_client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    text = tiny_target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tiny_target.tokenizer(text, add_special_tokens=False)["input_ids"]
    truth = until_eos(greedy_reference(ids, 12))
    assert whole.choices[0].message.content == tiny_target.tokenizer.decode(truth, skip_special_tokens=True)
    stream = openai_client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0,
                                                   stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == whole.choices[0].message.content


def test_sampled_completions_are_reproducible_by_seed(openai_client, model):
    kwargs = dict(model=model, prompt=[1, 2, 3], max_tokens=16, temperature=1.0, top_p=0.9)
    a = openai_client.completions.create(seed=5, **kwargs).choices[0].text
    b = openai_client.completions.create(seed=5, **kwargs).choices[0].text
    assert a == b


def test_logprobs_are_the_targets_own(openai_client, model, tiny_target):
    import torch

    prompt = [104, 105, 32, 116]
    reply = openai_client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    with torch.inference_mode():
        logits = tiny_target.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    want = torch.log_softmax(logits, -1)
    assert lp.token_logprobs[0] == pytest.approx(float(want.max()), abs=1e-4)
    assert list(lp.top_logprobs[0].values()) == pytest.approx(want.topk(2).values.tolist(), abs=1e-4)


def test_tokens_as_token_ids_name_the_exact_ids(openai_client, model, tiny_target):
    import torch

    prompt = [104, 105, 32, 116]
    reply = openai_client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=1,
                                             extra_body={"return_tokens_as_token_ids": True})
    lp = reply.choices[0].logprobs
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    assert all(t.startswith("token_id:") for t in lp.tokens) and list(lp.top_logprobs[0])[0] == lp.tokens[0]
    with torch.inference_mode():
        greedy = tiny_target.model.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)[0, 4:]
    assert until_eos(ids) == until_eos(greedy.tolist())
    plain = openai_client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=1)
    assert not plain.choices[0].logprobs.tokens[0].startswith("token_id:")


def test_bad_api_requests_are_refused_with_a_reason(tiny_server):
    url = f"{tiny_server.http_url}/v1/completions"
    reply = httpx.post(url, json={"prompt": [999], "max_tokens": 2})
    assert reply.status_code == 400 and "vocabulary" in reply.json()["error"]["message"]
    reply = httpx.post(url, json={"prompt": "x", "temperature": -1})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "temperature"
    reply = httpx.post(url, json={"prompt": "x", "n": 2, "max_tokens": 0})  # was a 422 in FastAPI's own shape
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"


def test_an_unknown_model_name_is_404(tiny_server, model):
    url = f"{tiny_server.http_url}/v1"
    reply = httpx.post(f"{url}/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found" and model in reply.json()["error"]["message"]
    assert httpx.get(f"{url}/models/{model}").json()["id"] == model
    assert httpx.get(f"{url}/models/tiny").status_code == 404


def test_the_api_serves_under_the_served_model_name(tiny_server):
    from edgespec.server.http_api import HttpState

    with serving(HttpState(served_model_name="coder"), tiny_server.core) as url:
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["coder"]
        reply = httpx.post(f"{url}/v1/completions", json={"model": "coder", "prompt": "x", "max_tokens": 2})
        assert reply.status_code == 200 and reply.json()["model"] == "coder"
        reply = httpx.post(f"{url}/v1/completions", json={"model": tiny_server.core.target.name, "prompt": "x"})
        assert reply.status_code == 404


def test_a_4_mib_prompt_is_refused_before_it_is_tokenized(tiny_server):
    """It was tokenized in full first: 6-9 s (21 s on a busy 2-core box) and hundreds of MB."""
    url = f"{tiny_server.http_url}/v1"
    prompt = "def f(x):\n    return x\n" * (4 * 1024 * 1024 // 24)
    for path, body in (("completions", {"prompt": prompt}),
                       ("chat/completions", {"messages": [{"role": "user", "content": prompt}]})):
        t0 = time.perf_counter()
        reply = httpx.post(f"{url}/{path}", json=body, timeout=60)
        took = time.perf_counter() - t0
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded", reply.text
        assert took < 2.0, f"refusing a 4 MiB prompt took {took:.1f} s"


def test_a_prompt_just_over_the_context_is_refused_and_one_under_is_served(tiny_server):
    url = f"{tiny_server.http_url}/v1/completions"
    limit = tiny_server.core.limits.max_context_tokens
    reply = httpx.post(url, json={"prompt": "a" * limit, "max_tokens": 1})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
    reply = httpx.post(url, json={"prompt": "a" * (limit - 1), "max_tokens": 5, "temperature": 0})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 1  # clamped to the room left


def test_a_body_over_the_limit_is_413_with_or_without_a_length(tiny_server):
    from edgespec.server.http_api import HttpState

    body = b'{"prompt": "' + b"x" * 2000 + b'"}'
    with serving(HttpState(max_body_bytes=1000), tiny_server.core) as url:
        reply = httpx.post(f"{url}/v1/completions", content=body)
        assert reply.status_code == 413 and "1000 bytes" in reply.json()["error"]["message"]
        reply = httpx.post(f"{url}/v1/completions", content=iter([body[:600], body[600:]]))  # chunked: no length
        assert reply.status_code == 413
        reply = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert reply.status_code == 200


def test_the_key_is_checked_before_anything_else(tiny_server):
    from edgespec.server.http_api import HttpState

    with serving(HttpState(api_key="s3cret"), tiny_server.core) as url:
        bad_body = {"prompt": 5, "temperature": "hot"}
        reply = httpx.post(f"{url}/v1/completions", json=bad_body)  # was a 422 listing the schema
        assert reply.status_code == 401 and "API key" in reply.json()["error"]["message"]
        assert httpx.post(f"{url}/v1/completions", content=b"x" * 100, headers={"x-api-key": "wrong"}).status_code == 401
        assert httpx.get(f"{url}/v1/models").status_code == 401
        for headers in ({"Authorization": "Bearer s3cret"}, {"authorization": "bearer s3cret"},
                        {"Authorization": "BEARER  s3cret"}, {"x-api-key": "s3cret"}):
            reply = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=headers)
            assert reply.status_code == 200, headers
        assert httpx.get(f"{url}/health").status_code == 200  # probes need no key
        assert httpx.get(f"{url}/metrics").status_code == 200  # nor do scrapers, unless asked


def test_metrics_can_ask_for_the_key(tiny_server):
    from edgespec.server.http_api import HttpState

    with serving(HttpState(api_key="s3cret", metrics_need_key=True), tiny_server.core) as url:
        assert httpx.get(f"{url}/metrics").status_code == 401
        reply = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer s3cret"})
        assert reply.status_code == 200 and "edgespec_sessions" in reply.text


def test_a_non_streaming_generation_stops_when_its_caller_disconnects(tiny_server, monkeypatch):
    steps = slowed_calls(monkeypatch, tiny_server.core.scheduler, "prefill", 0.02)
    body = {"prompt": "a", "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{tiny_server.http_url}/v1/completions", json=body, timeout=0.5)
    assert assert_calls_stopped(steps) < 100


def test_a_streaming_generation_stops_when_its_caller_disconnects(tiny_server, monkeypatch):
    steps = slowed_calls(monkeypatch, tiny_server.core.scheduler, "prefill", 0.02)
    body = {"prompt": "a", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{tiny_server.http_url}/v1/completions", json=body) as reply:
        for _ in zip(range(3), reply.iter_lines()):
            pass
    assert assert_calls_stopped(steps) < 100


def test_a_browser_page_tokenizes_and_reads_the_version_of_the_plain_api(tiny_server, caplog):
    """CORS (--allowed-origins): the preflight is answered before the key is asked for, answers carry the
    origin; /tokenize, /detokenize, /version in vLLM's shapes; --enable-log-requests logs fields only."""
    import logging

    from edgespec.server.http_api import HttpState
    from edgespec.shared import __version__

    tokenizer = tiny_server.core.target.tokenizer
    state = HttpState(api_key="s3cret", allowed_origins=("http://page.test",), log_requests=True)
    with serving(state, tiny_server.core) as url:
        preflight = httpx.options(f"{url}/tokenize", headers={
            "Origin": "http://page.test", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == "http://page.test"
        other = httpx.options(f"{url}/tokenize", headers={"Origin": "http://evil.test",
                                                          "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in other.headers
        key = {"Authorization": "Bearer s3cret", "Origin": "http://page.test"}
        refused = httpx.post(f"{url}/tokenize", json={"prompt": "def f"}, headers={"Origin": "http://page.test"})
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "http://page.test"
        tokens = httpx.post(f"{url}/tokenize", json={"prompt": "def f(x):", "return_token_strs": True},
                            headers=key).json()
        want = tokenizer("def f(x):", add_special_tokens=False)["input_ids"]
        assert tokens["tokens"] == want and tokens["count"] == len(want) and len(tokens["token_strs"]) == len(want)
        assert tokens["max_model_len"] == tiny_server.core.limits.max_context_tokens
        chat = httpx.post(f"{url}/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, headers=key)
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)
        assert chat.json()["tokens"] == tokenizer(text, add_special_tokens=False)["input_ids"]
        back = httpx.post(f"{url}/detokenize", json={"tokens": want}, headers=key).json()
        assert back == {"prompt": "def f(x):"}
        bad = httpx.post(f"{url}/detokenize", json={"tokens": [10 ** 9]}, headers=key)
        assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
        neither = httpx.post(f"{url}/tokenize", json={}, headers=key)
        assert neither.status_code == 400 and "either 'prompt'" in neither.json()["error"]["message"]
        assert httpx.get(f"{url}/version", headers=key).json() == {"version": __version__}
        with caplog.at_level(logging.INFO, logger="edgespec.requests"):
            done = httpx.post(f"{url}/v1/completions", json={"prompt": "secret text", "max_tokens": 2,
                                                             "temperature": 0}, headers=key, timeout=60)
        assert done.status_code == 200
        # The plain API answers with the local API's per-request speculative object: no drafts here.
        spec = done.json()["edgespec"]["spec_decode"]
        assert spec["num_drafts"] == 0 and {"spec_accept_length", "spec_accept_rate", "spec_verify_ct",
                                            "num_accepted_tokens_per_pos", "mean_acceptance_length"} <= set(spec)
    logged = [r for r in caplog.records if getattr(r, "request_id", None)]
    assert len(logged) == 1 and logged[0].endpoint == "completions" and logged[0].max_tokens == 2
    assert "secret text" not in logged[0].getMessage() and "secret" not in str(vars(logged[0]))
