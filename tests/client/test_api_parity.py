"""Both OpenAI-compatible APIs, driven by the real `openai` client: they answer alike and refuse alike.

The server's plain API (the target alone) and the client's local API (speculative, against the same
server) run in this process on real sockets. Greedy answers must be identical; sampling, defaults,
n, stop strings, usage and every refusal must behave the same way on both.
"""
from __future__ import annotations


import httpx
import pytest
from support.asgi_server import serving
from support.servers import running_server

openai = pytest.importorskip("openai")

EOS_PROMPT = "cx"  # the tiny target's greedy continuation of it ends with EOS after 16 tokens


class Apis:
    def __init__(self, server, client, client_url: str):
        self.server, self.client = server, client
        self.model = server.core.target.name
        self.urls = {"server": f"{server.http_url}/v1", "client": client_url}
        self.sdk = {side: openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
                    for side, url in self.urls.items()}

    def both(self, call):
        return {side: call(sdk) for side, sdk in self.sdk.items()}


@pytest.fixture(scope="module")
def apis(tiny_model_dir, tiny_drafter_dir):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.http_api import build_app
    from edgespec.client.link.grpc_transport import LinkConfig

    # No prefix cache: the plain API's usage would report prompt_tokens_details, which the client's has not (and
    # which side asked first would decide its count); tests/server/prefix/test_cache_api.py covers it.
    with running_server(tiny_model_dir, max_context_tokens=512, prefix_cache_bytes=0) as server:
        drafter = DrafterOptions("independent", model=str(tiny_drafter_dir), dtype="float32")
        client = EdgespecClient(ClientConfig(LinkConfig(server.address), drafter, tokenizer=str(tiny_model_dir)))
        with serving(build_app(client)) as url:
            yield Apis(server, client, f"{url}/v1")
        client.close()


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value.status_code, info.value.body


def test_greedy_completion_is_the_same_text_and_usage_on_both(apis):
    got = apis.both(lambda sdk: sdk.completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=40,
                                                       temperature=0))
    server, client = got["server"], got["client"]
    assert server.choices[0].text == client.choices[0].text
    assert server.choices[0].finish_reason == client.choices[0].finish_reason == "stop"  # EOS
    # The EOS token was generated: both count it (the client used to count one more than the server).
    assert server.usage.completion_tokens == client.usage.completion_tokens == 17
    assert server.usage.prompt_tokens == client.usage.prompt_tokens == 2


def test_greedy_chat_whole_and_streamed_are_the_same_on_both(apis):
    messages = [{"role": "user", "content": "say hi"}]
    whole = apis.both(lambda sdk: sdk.chat.completions.create(model=apis.model, messages=messages, max_tokens=20,
                                                              temperature=0))
    assert whole["server"].choices[0].message.content == whole["client"].choices[0].message.content
    assert whole["server"].usage == whole["client"].usage
    streamed = apis.both(lambda sdk: "".join(
        c.choices[0].delta.content or "" for c in sdk.chat.completions.create(
            model=apis.model, messages=messages, max_tokens=20, temperature=0, stream=True)))
    assert streamed["server"] == streamed["client"] == whole["server"].choices[0].message.content


def test_content_given_as_text_parts_is_the_same_as_a_string_on_both(apis):
    def ask(sdk, content):
        return sdk.chat.completions.create(model=apis.model, messages=[{"role": "user", "content": content}],
                                           max_tokens=12, temperature=0).choices[0].message.content

    parts = [{"type": "text", "text": "say"}, {"type": "text", "text": "hi"}]
    got = apis.both(lambda sdk: (ask(sdk, parts), ask(sdk, "say\nhi")))
    assert got["server"][0] == got["server"][1] == got["client"][0] == got["client"][1]


def test_stop_strings_cut_alike_on_both(apis):
    full = apis.sdk["server"].completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=16,
                                                 temperature=0).choices[0].text
    stop = full[5:7]
    assert stop and full.index(stop) >= 1
    want = full[:full.index(stop)]
    for stream in (False, True):
        def ask(sdk):
            out = sdk.completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=16, temperature=0,
                                         stop=[stop, "never-there"], stream=stream)
            return "".join(c.choices[0].text for c in out) if stream else out.choices[0].text

        assert apis.both(ask) == {"server": want, "client": want}
    usage = apis.both(lambda sdk: sdk.completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=16,
                                                         temperature=0, stop=stop).usage)
    assert usage["server"] == usage["client"]


def test_n_choices_on_both(apis):
    got = apis.both(lambda sdk: sdk.chat.completions.create(
        model=apis.model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, n=3))
    for side, reply in got.items():
        assert [c.index for c in reply.choices] == [0, 1, 2], side
        assert len({c.message.content for c in reply.choices}) == 1, side  # greedy: the same answer three times
    assert got["server"].choices[0].message.content == got["client"].choices[0].message.content
    # usage counts every choice's tokens, the prompt once
    assert got["server"].usage == got["client"].usage and got["server"].usage.completion_tokens % 3 == 0
    chunks = apis.both(lambda sdk: list(sdk.completions.create(model=apis.model, prompt="ab", max_tokens=4,
                                                                temperature=0, n=2, stream=True)))
    for side, stream in chunks.items():
        texts = ["".join(c.choices[0].text for c in stream if c.choices and c.choices[0].index == i) for i in (0, 1)]
        assert texts[0] == texts[1] and texts[0], side


def sampled(sdk, model, **kwargs) -> str:
    return sdk.completions.create(model=model, prompt="def f(", max_tokens=24, **kwargs).choices[0].text


def test_a_seed_makes_sampling_reproducible_and_no_seed_draws_a_fresh_one_on_both(apis):
    seeded = {}
    for side, sdk in apis.sdk.items():
        a, b = (sampled(sdk, apis.model, temperature=1.5, seed=7) for _ in range(2))
        assert a == b, side
        seeded[side] = a
        fresh = {sampled(sdk, apis.model, temperature=1.5) for _ in range(3)}
        assert len(fresh) > 1, f"{side}: three unseeded samples were identical (a fixed seed?)"
    # each token is drawn by its position: the client's trees write the text the server's plain steps write
    assert seeded["client"] == seeded["server"]


def test_the_default_temperature_is_1_on_both(apis):
    for side, sdk in apis.sdk.items():
        greedy = sampled(sdk, apis.model, temperature=0)
        defaults = [sampled(sdk, apis.model, seed=s) for s in range(3)]
        assert defaults == [sampled(sdk, apis.model, seed=s, temperature=1.0) for s in range(3)], side
        assert any(d != greedy for d in defaults), side


def test_top_k_1_is_greedy_on_both(apis):
    for side, sdk in apis.sdk.items():
        greedy = sampled(sdk, apis.model, temperature=0)
        assert sampled(sdk, apis.model, temperature=1.5, seed=3, extra_body={"top_k": 1}) == greedy, side


def same_logprobs(server: list, client: list, what: str) -> None:
    """Chat logprob entries: the same tokens and alternatives, the same numbers up to float rounding (the
    client's come from tree verification rows, the server's from one decode step each)."""
    assert [e.token for e in server] == [e.token for e in client], what
    assert [e.logprob for e in client] == pytest.approx([e.logprob for e in server], abs=1e-4), what
    assert [[t.token for t in e.top_logprobs] for e in server] == [[t.token for t in e.top_logprobs] for e in client]
    for s, c in zip(server, client):
        assert [t.logprob for t in c.top_logprobs] == pytest.approx([t.logprob for t in s.top_logprobs], abs=1e-4)
        assert c.bytes == s.bytes


def test_logprobs_are_the_targets_and_the_same_on_both(apis):
    messages = [{"role": "user", "content": "hi"}]
    got = apis.both(lambda sdk: sdk.chat.completions.create(model=apis.model, messages=messages, max_tokens=24,
                                                            temperature=0, logprobs=True, top_logprobs=3))
    server, client = got["server"].choices[0], got["client"].choices[0]
    assert server.message.content == client.message.content
    assert len(server.logprobs.content) == got["server"].usage.completion_tokens == got["client"].usage.completion_tokens
    for entry in server.logprobs.content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == entry.logprob  # greedy: the chosen token is the most likely
    same_logprobs(server.logprobs.content, client.logprobs.content, "whole")

    streamed = apis.both(lambda sdk: [e for c in sdk.chat.completions.create(
        model=apis.model, messages=messages, max_tokens=24, temperature=0, logprobs=True, top_logprobs=3,
        stream=True) if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content])
    same_logprobs(server.logprobs.content, streamed["server"], "server streamed")
    same_logprobs(server.logprobs.content, streamed["client"], "client streamed")

    legacy = apis.both(lambda sdk: sdk.completions.create(model=apis.model, prompt="ab", max_tokens=12,
                                                          temperature=0, logprobs=2).choices[0].logprobs)
    assert legacy["server"].tokens == legacy["client"].tokens
    assert legacy["server"].text_offset == legacy["client"].text_offset
    assert legacy["client"].token_logprobs == pytest.approx(legacy["server"].token_logprobs, abs=1e-4)
    for s, c in zip(legacy["server"].top_logprobs, legacy["client"].top_logprobs):
        assert list(c) == list(s) and list(c.values()) == pytest.approx(list(s.values()), abs=1e-4)


def test_sampled_tokens_carry_the_raw_logprobs_on_both(apis):
    """Under sampling the logprobs are still the raw model output's (before temperature), as vLLM's default:
    at the first position they are the greedy request's."""
    def first(sdk, **kwargs):
        reply = sdk.chat.completions.create(model=apis.model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, logprobs=True, top_logprobs=20, **kwargs)
        return reply.choices[0].logprobs.content[0]

    for side, sdk in apis.sdk.items():
        greedy, sampled = first(sdk, temperature=0), first(sdk, temperature=1.5, seed=5)
        top = [t.logprob for t in sampled.top_logprobs]
        assert top == sorted(top, reverse=True) and len(top) == 20, side
        assert top == pytest.approx([t.logprob for t in greedy.top_logprobs], abs=1e-5), side


def test_include_usage_ends_the_stream_with_the_usage_on_both(apis):
    def ask(sdk):
        chunks = list(sdk.chat.completions.create(model=apis.model, messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=6, temperature=0, stream=True,
                                                  stream_options={"include_usage": True}))
        return chunks[-1]

    for side, last in apis.both(ask).items():
        assert last.choices == [] and last.usage.completion_tokens >= 1, side


# Every refusal is the same on both APIs: status, the field named, OpenAI's error shape.
REFUSED = [
    (dict(n=2, max_tokens=0), 400, "max_tokens"),
    (dict(temperature=-1), 400, "temperature"),
    (dict(temperature=2.5), 400, "temperature"),
    (dict(top_p=0), 400, "top_p"),
    (dict(n=99), 400, "n"),
    (dict(seed="7"), 400, "seed"),
    (dict(stop=["x"] * 17), 400, "stop"),
    (dict(logit_bias={"one": 5}), 400, "logit_bias"),
    (dict(frequency_penalty=2.5), 400, "frequency_penalty"),
    (dict(presence_penalty=-3), 400, "presence_penalty"),
    (dict(response_format={"type": "yaml"}), 400, "response_format"),
    (dict(tools=[{"type": "function", "function": {"name": "f g"}}]), 400, "tools[0].function.name"),
    (dict(stream_options={"include_usage": True}), 400, "stream_options"),
    (dict(extra_body={"min_tokens": 3}), 400, "min_tokens"),
    (dict(model="gpt-4o"), 404, "model"),
]


@pytest.mark.parametrize("fields,status,param", REFUSED, ids=[r[2] + f"-{i}" for i, r in enumerate(REFUSED)])
def test_refusals_are_the_same_on_both(apis, fields, status, param):
    fields = {"model": apis.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    got = apis.both(lambda sdk: error_of(lambda: sdk.chat.completions.create(**fields)))
    assert got["server"] == got["client"]
    code, body = got["server"]
    assert code == status and body["param"] == param and body["message"], body


@pytest.mark.parametrize("fields,param", [(dict(echo=True), "echo"), (dict(best_of=3), "best_of"),
                                          (dict(logprobs=6), "logprobs"), (dict(suffix="x"), "suffix"),
                                          (dict(prompt=["a", "b"]), "prompt"), (dict(prompt=""), "prompt")])
def test_completion_refusals_are_the_same_on_both(apis, fields, param):
    fields = {"model": apis.model, "prompt": "hi", "max_tokens": 2, **fields}
    got = apis.both(lambda sdk: error_of(lambda: sdk.completions.create(**fields)))
    assert got["server"] == got["client"] and got["server"][0] == 400 and got["server"][1]["param"] == param


def test_models_and_one_model_on_both(apis):
    for side, url in apis.urls.items():
        listed = apis.sdk[side].models.list()
        assert [m.id for m in listed.data] == [apis.model], side
        assert apis.sdk[side].models.retrieve(apis.model).id == apis.model
        status, body = error_of(lambda: apis.sdk[side].models.retrieve("gpt-4o"))
        assert status == 404 and body["code"] == "model_not_found", side


def test_nan_wrong_types_and_bad_json_get_400_on_both(apis):
    bodies = [b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "top_p": NaN}',
              b'{"prompt": "x", "max_tokens": Infinity}', b'{"prompt": "x", "max_tokens": "5"}',
              b'{"prompt": "x", "stream": 1}', b"[1, 2]", b"{not json", b'"\\ud800"', b"[" * 100000]
    for url in apis.urls.values():
        for raw in bodies:
            r = httpx.post(f"{url}/completions", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400, (url, raw[:40], r.text)
            assert r.json()["error"]["message"]
        chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
        r = httpx.post(f"{url}/chat/completions", json=chat)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content", r.text


# vLLM's request fields, through the `openai` client's extra_body as vLLM's users send them.

def test_stop_token_ids_end_both_answers_at_the_same_token(apis):
    whole = apis.both(lambda sdk: sdk.completions.create(model=apis.model, prompt="def add(a, b):", max_tokens=24,
                                                         temperature=0, extra_body={"ignore_eos": True}))
    from edgespec.client.loop.generation import GenerationConfig

    # the target's greedy ids of that answer (text does not tokenize back to the same ids)
    ids = apis.client.generate(apis.client.encode("def add(a, b):"),
                               GenerationConfig(max_new_tokens=24, ignore_eos=True)).token_ids
    assert apis.client.decode(ids) == whole["server"].choices[0].text
    stop_id = ids[4]  # the token at the fifth position ends the answer there (or where it first comes)
    cut = apis.both(lambda sdk: sdk.completions.create(
        model=apis.model, prompt="def add(a, b):", max_tokens=24, temperature=0,
        extra_body={"ignore_eos": True, "stop_token_ids": [stop_id]}))
    for side in ("server", "client"):
        choice, usage = cut[side].choices[0], cut[side].usage
        assert choice.finish_reason == "stop", side
        assert usage.completion_tokens == ids.index(stop_id) + 1 < 24, side
        assert whole[side].choices[0].text.startswith(choice.text), side
    assert cut["server"].choices[0].text == cut["client"].choices[0].text


def test_min_tokens_holds_back_eos_on_both_alike(apis):
    """EOS_PROMPT's greedy answer ends with EOS after 16 tokens; with min_tokens 24 the target may not end it
    there: both APIs mask EOS in every row shorter than 24 (the client's trees included) and agree."""
    plain = apis.both(lambda sdk: sdk.completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=40,
                                                         temperature=0))
    assert plain["server"].usage.completion_tokens <= 17 and plain["server"].choices[0].finish_reason == "stop"
    held = apis.both(lambda sdk: sdk.completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=40,
                                                        temperature=0, extra_body={"min_tokens": 24}))
    for side in ("server", "client"):
        assert held[side].usage.completion_tokens >= 24, side
    assert held["server"].choices[0].text == held["client"].choices[0].text
    assert held["server"].usage.completion_tokens == held["client"].usage.completion_tokens
    status, body = error_of(lambda: apis.sdk["client"].completions.create(
        model=apis.model, prompt="x", max_tokens=4, extra_body={"min_tokens": 5}))
    assert status == 400 and body["param"] == "min_tokens"


def test_chat_template_kwargs_reach_the_template_on_both(apis):
    messages = [{"role": "user", "content": "hi"}]
    tail = len(apis.server.core.target.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    usual = apis.both(lambda sdk: sdk.chat.completions.create(model=apis.model, messages=messages, max_tokens=2,
                                                              temperature=0))
    bare = apis.both(lambda sdk: sdk.chat.completions.create(
        model=apis.model, messages=messages, max_tokens=2, temperature=0,
        extra_body={"chat_template_kwargs": {"add_generation_prompt": False, "enable_thinking": False}}))
    for side in ("server", "client"):
        assert usual[side].usage.prompt_tokens - bare[side].usage.prompt_tokens == tail > 0, side
    for side in ("server", "client"):
        status, body = error_of(lambda: apis.sdk[side].chat.completions.create(
            model=apis.model, messages=messages, max_tokens=2, extra_body={"chat_template_kwargs": {"chat_template": "x"}}))
        assert status == 400 and "chat_template" in body["message"], side


def test_the_python_client_takes_the_same_fields(apis, tiny_model_dir):
    from edgespec.client import Client

    held = apis.sdk["server"].completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=40, temperature=0,
                                                 extra_body={"min_tokens": 24})
    with Client(apis.server.address, "ngram", tokenizer=str(tiny_model_dir), min_deadline_s=0.3) as client:
        assert client.complete(EOS_PROMPT, max_tokens=40, temperature=0, min_tokens=24) == held.choices[0].text
        assert len(client.last_result.token_ids) == held.usage.completion_tokens >= 24
        with pytest.raises(ValueError, match="min_tokens"):
            client.complete(EOS_PROMPT, max_tokens=4, min_tokens=5)


def test_structured_outputs_constrain_both_answers_alike(apis):
    import re

    choice = apis.both(lambda sdk: sdk.chat.completions.create(
        model=apis.model, messages=[{"role": "user", "content": "yes or no?"}], max_tokens=16, temperature=0,
        extra_body={"structured_outputs": {"choice": ["maybe so", "no way"]}}))
    regex = apis.both(lambda sdk: sdk.completions.create(
        model=apis.model, prompt="Three digits:", max_tokens=8, temperature=0,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}"}}))
    for side in ("server", "client"):
        assert choice[side].choices[0].message.content in ("maybe so", "no way"), side
        assert re.fullmatch(r"[0-9]{3}", regex[side].choices[0].text), side
    assert choice["server"].choices[0].message.content == choice["client"].choices[0].message.content
    assert regex["server"].choices[0].text == regex["client"].choices[0].text
    for side in ("server", "client"):
        status, body = error_of(lambda: apis.sdk[side].completions.create(
            model=apis.model, prompt="x", max_tokens=4, extra_body={"structured_outputs": {"regex": "(("}}))
        assert status == 400 and body["param"] == "structured_outputs.regex", side


def test_the_python_client_constrains_as_the_apis_do(apis, tiny_model_dir):
    import json

    from edgespec.client import Client

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    over_http = apis.sdk["server"].completions.create(
        model=apis.model, prompt="A number:", max_tokens=24, temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
    with Client(apis.server.address, "ngram", tokenizer=str(tiny_model_dir), min_deadline_s=0.3) as client:
        text = client.complete("A number:", max_tokens=24, temperature=0, response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        assert text == over_http.choices[0].text and isinstance(json.loads(text)["n"], int)
        choice = client.complete("Pick:", max_tokens=8, temperature=0,
                                 structured_outputs={"choice": ["left", "right"]})
        assert choice in ("left", "right")
        with pytest.raises(ValueError, match="structured_outputs"):
            client.complete("x", max_tokens=4, structured_outputs={"regex": "(("})
