"""Tools through ``edgespec.Client`` against a real tiny server, and the same request through its HTTP chat API
(the official `openai` library on a real socket): the same call, parsed, with arguments that follow the schema.

The tiny target's weights are random, so a well-formed call can only come from the constraint; at temperature 0
the speculative answer is the target's own greedy one, so both sides must agree exactly.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from support.servers import running_server
from support.tool_specs import CLOCK, WEATHER

from edgespec.client import AsyncClient, ChatReply, Client, ToolCall

openai = pytest.importorskip("openai")

LINK = {"min_deadline_s": 0.3, "connect_timeout_s": 0.5}
ASK = [{"role": "user", "content": "weather in Oslo?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def follows_the_schema(name: str, arguments) -> bool:
    if name == "get_weather":
        return (isinstance(arguments, dict) and set(arguments) == {"city", "unit"}
                and isinstance(arguments["city"], str) and len(arguments["city"]) <= 12 and arguments["unit"] in "CF"
                and len(arguments["unit"]) == 1)
    return name == "now" and arguments == {}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """The tiny target with both sides: gRPC for edgespec.Client, the plain HTTP API for the openai library."""
    with running_server(tiny_model_dir, max_context_tokens=1024) as handle:
        yield handle


@pytest.fixture(scope="module")
def http(server):
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server, tiny_model_dir, tiny_drafter_dir):
    with Client(server.address, "independent", drafter_model=str(tiny_drafter_dir), tokenizer=str(tiny_model_dir),
                **LINK) as c:
        yield c


def http_call(http, server, **request):
    answer = http.chat.completions.create(model=server.core.target.name, **{"temperature": 0, "max_tokens": 150,
                                                                             **request})
    choice = answer.choices[0]
    return choice, [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]


def test_a_required_tool_call_comes_back_parsed_and_the_same_as_the_http_apis(client, http, server):
    reply = client.chat(ASK, tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False,
                        temperature=0, max_tokens=150)
    assert isinstance(reply, ChatReply) and reply.finish_reason == "tool_calls"
    (call,) = reply.tool_calls
    assert isinstance(call, ToolCall) and call.id.startswith("call_")
    assert follows_the_schema(call.name, call.arguments), call
    assert json.loads(call.arguments_json) == call.arguments
    assert client.last_result.metrics.num_drafts >= 1  # it went through the speculative loop
    choice, calls = http_call(http, server, messages=ASK, tools=[WEATHER, CLOCK], tool_choice="required",
                              parallel_tool_calls=False)
    assert choice.finish_reason == "tool_calls" and calls == [(call.name, call.arguments)]
    assert reply.content == choice.message.content


def test_a_named_function_through_the_async_client_then_a_second_turn(server, http, tiny_model_dir,
                                                                     tiny_drafter_dir):
    """The named function is the one called (once), with arguments for its schema, as over HTTP; the call and
    its result go back as ``reply.message`` and a tool message, and the next answer is the HTTP API's too."""
    async def go():
        async with AsyncClient(server.address, "independent", drafter_model=str(tiny_drafter_dir),
                               tokenizer=str(tiny_model_dir), **LINK) as c:
            reply = await c.chat(ASK, tools=[WEATHER, CLOCK], tool_choice=NAMED, temperature=0, max_tokens=150)
            follow = ASK + [reply.message, {"role": "tool", "tool_call_id": reply.tool_calls[0].id,
                                            "content": "12 degrees"}]
            answer = await c.chat(follow, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=8)
            return reply, follow, answer

    reply, follow, answer = asyncio.run(go())
    (call,) = reply.tool_calls
    assert call.name == "get_weather" and follows_the_schema(call.name, call.arguments), call
    assert reply.finish_reason == "tool_calls"
    choice, calls = http_call(http, server, messages=ASK, tools=[WEATHER, CLOCK], tool_choice=NAMED)
    assert calls == [(call.name, call.arguments)]
    # tool_choice "none": the tools are rendered, nothing is parsed; the answer is the target's, as over HTTP
    assert isinstance(answer, ChatReply) and answer.tool_calls == () and isinstance(answer.content, str)
    choice, _ = http_call(http, server, messages=follow, tools=[WEATHER], tool_choice="none", max_tokens=8)
    assert answer.content == choice.message.content and choice.message.tool_calls is None
    assert answer.finish_reason == choice.finish_reason


def test_tools_change_the_prompt_as_the_template_renders_them(client):
    """The tools reach the template: the rendered prompt holds the function's schema, so it is longer."""
    plain, _ = client._chat_prompt(ASK, None, None, None, None)
    with_tools, use = client._chat_prompt(ASK, [WEATHER], "auto", None, None)
    assert use is not None and use.grammar is None and use.parse
    assert len(with_tools) > len(plain) and "get_weather" in client.edge.decode(with_tools)


@pytest.mark.parametrize("request_, message", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "'tool_choice' names function 'nope', which is not among the tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "'tools[0].function.name' must be 1-64 letters, digits, '_' or '-'"),
    ({"tool_choice": "required"}, "'tool_choice' needs 'tools'"),
])
def test_bad_tools_are_the_http_apis_400_as_a_value_error(client, http, server, request_, message):
    with pytest.raises(ValueError) as info:
        client.chat(ASK, **request_)
    assert str(info.value) == message
    with pytest.raises(openai.BadRequestError) as http_info:
        http.chat.completions.create(model=server.core.target.name, messages=ASK, **request_)
    assert http_info.value.body["message"] == message


def test_stream_with_tools_is_refused_and_chat_options_are_named(client):
    with pytest.raises(ValueError, match="stream=True cannot be given with tools"):
        client.chat(ASK, stream=True, tools=[WEATHER])
    with pytest.raises(TypeError, match="'tool' is not a sampling option .*did you mean 'tools'"):
        client.chat(ASK, tool=[WEATHER])
