"""Structured output, tools and vLLM's sampling controls through the official `openai` client, on both APIs.

The server's plain API (the target alone, processors applied step by step) and the client's local API
(speculative: the server applies them per tree node, the drafter drafts inside the grammar) run on real
sockets against the tiny random target. Its weights say nothing sensible, so a valid document or tool call
can only come from the constraint; greedy answers must be the same on both sides (lossless).
"""
from __future__ import annotations

import json

import pytest
from support.asgi_server import serving
from support.servers import running_server
from support.tool_specs import CLOCK, WEATHER

openai = pytest.importorskip("openai")

EOS_PROMPT = "cx"  # the tiny target's greedy continuation of it ends with EOS after 16 tokens
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "size": {"enum": ["S", "M", "L"]},
    "in_stock": {"type": "boolean"}}, "required": ["name", "size", "in_stock"], "additionalProperties": False}


class Apis:
    def __init__(self, server, client_url: str):
        self.model = server.core.target.name
        self.sdk = {side: openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
                    for side, url in {"server": f"{server.http_url}/v1", "client": client_url}.items()}

    def both(self, call):
        return {side: call(sdk) for side, sdk in self.sdk.items()}


@pytest.fixture(scope="module")
def apis(tiny_model_dir, tiny_drafter_dir):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.http_api import build_app
    from edgespec.client.link.grpc_transport import LinkConfig

    with running_server(tiny_model_dir, max_context_tokens=1024) as server:
        drafter = DrafterOptions("independent", model=str(tiny_drafter_dir), dtype="float32")
        client = EdgespecClient(ClientConfig(LinkConfig(server.address), drafter, tokenizer=str(tiny_model_dir)))
        with serving(build_app(client)) as url:
            yield Apis(server, f"{url}/v1")
        client.close()


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value.status_code, info.value.body


def check_product(doc: dict) -> None:
    assert set(doc) == {"name", "size", "in_stock"}
    assert isinstance(doc["name"], str) and len(doc["name"]) <= 10
    assert doc["size"] in ("S", "M", "L") and isinstance(doc["in_stock"], bool)


def test_json_schema_answers_are_valid_and_the_same_on_both(apis):
    got = apis.both(lambda sdk: sdk.chat.completions.create(
        model=apis.model, messages=[{"role": "user", "content": "a product"}], temperature=0, max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "product", "schema": SCHEMA}}))
    texts = {side: r.choices[0].message.content for side, r in got.items()}
    assert texts["server"] == texts["client"]
    check_product(json.loads(texts["server"]))
    assert got["server"].choices[0].finish_reason == got["client"].choices[0].finish_reason == "stop"


def test_json_object_mode_on_completions_gives_an_object(apis):
    got = apis.both(lambda sdk: sdk.completions.create(
        model=apis.model, prompt="{", temperature=0, max_tokens=200, frequency_penalty=0.5,
        extra_body={"response_format": {"type": "json_object"}}))  # vLLM's extension to completions
    assert got["server"].choices[0].text == got["client"].choices[0].text
    if got["server"].choices[0].finish_reason == "stop":
        assert isinstance(json.loads(got["server"].choices[0].text), dict)
    else:  # an object the random weights keep going in: it is still a valid prefix of one
        assert got["server"].choices[0].text.startswith("{")


def test_a_required_tool_call_is_parsed_on_both(apis):
    messages = [{"role": "user", "content": "weather in Oslo?"}]
    got = apis.both(lambda sdk: sdk.chat.completions.create(
        model=apis.model, messages=messages, temperature=0, max_tokens=150, tools=[WEATHER, CLOCK],
        tool_choice="required", parallel_tool_calls=False))
    calls = {}
    for side, r in got.items():
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", side
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        calls[side] = (call.function.name, json.loads(call.function.arguments))
    assert calls["server"] == calls["client"]
    name, arguments = calls["server"]
    if name == "get_weather":
        assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("C", "F")
    else:
        assert name == "now" and arguments == {}


def test_a_named_tool_streamed_then_answered_in_a_second_turn(apis):
    messages = [{"role": "user", "content": "weather?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for side, sdk in apis.sdk.items():
        chunks = list(sdk.chat.completions.create(model=apis.model, messages=messages, temperature=0,
                                                  max_tokens=150, tools=[WEATHER, CLOCK], tool_choice=choice,
                                                  stream=True))
        deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        (call,) = deltas[0]
        assert call.function.name == "get_weather", side
        arguments = json.loads(call.function.arguments)
        assert set(arguments) == {"city", "unit"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        # the call and its result go back as the openai library sends them: the template renders both
        follow = messages + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                             "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "12 degrees"}]
        answer = sdk.chat.completions.create(model=apis.model, messages=follow, temperature=0, max_tokens=8,
                                             tools=[WEATHER], tool_choice="none")
        assert answer.choices[0].message.tool_calls is None and answer.usage.prompt_tokens > 100


def test_sampling_controls_change_greedy_output_alike_on_both(apis):
    def ask(sdk, **extra):
        return sdk.completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=24, temperature=0,
                                      extra_body=extra or None).choices[0]

    plain = apis.both(ask)
    controls = {"presence_penalty": 1.0, "frequency_penalty": 0.5, "repetition_penalty": 1.5,
                "logit_bias": {"60": 5.0}, "min_p": 0.1}
    penalised = apis.both(lambda sdk: ask(sdk, **controls))
    assert penalised["server"].text == penalised["client"].text
    assert penalised["server"].text != plain["server"].text
    # ignore_eos: past the EOS at token 17, to the length asked for
    assert plain["server"].finish_reason == "stop"
    long = apis.both(lambda sdk: sdk.completions.create(model=apis.model, prompt=EOS_PROMPT, max_tokens=24,
                                                        temperature=0, extra_body={"ignore_eos": True}))
    for side, r in long.items():
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 24, side


@pytest.mark.parametrize("fields, param", [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_values_get_the_same_400_naming_the_field_on_both(apis, fields, param):
    body = {"model": apis.model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    got = apis.both(lambda sdk: error_of(lambda: sdk.chat.completions.create(**body, extra_body=fields)))
    assert got["server"] == got["client"]
    code, error = got["server"]
    assert code == 400 and error["param"] == param and error["message"], error
