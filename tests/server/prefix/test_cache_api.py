"""The prefix cache seen from outside, on a real server with the tiny target: a chat's second turn through the
official openai client reports its cached prompt tokens in usage (vLLM's prompt_tokens_details) and answers
the target's greedy text; a second Open over gRPC says in Opened.cached_tokens what it restored; /metrics has
vLLM's two counters; --prefix-cache-gb 0 turns it all off."""
from __future__ import annotations

import httpx
import pytest
from support.servers import running_server
from support.streams import ServerStream

import grpc
from edgespec.proto.edgespec.v1 import pb
from edgespec.server.cli import server_config


@pytest.fixture(scope="module")
def cached_server(tiny_model_dir):
    with running_server(tiny_model_dir, prefix_cache_bytes=1 << 28, max_context_tokens=512) as handle:
        yield handle


def chat(server, messages, **kwargs):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)
    return client.chat.completions.create(model=server.core.target.name, messages=messages, temperature=0,
                                          max_tokens=12, **kwargs)


def counter(server, name: str) -> float:
    page = httpx.get(f"{server.http_url}/metrics").text
    line = next(x for x in page.splitlines() if x.startswith(f"edgespec:{name}_total{{"))
    return float(line.rsplit(" ", 1)[1])


def test_a_chats_second_turn_reports_its_cached_tokens_and_answers_as_without_them(cached_server, tiny_model_dir,
                                                                                   greedy_reference, tiny_target):
    turn_one = [{"role": "user", "content": "def add(a, b):"}]
    first = chat(cached_server, turn_one)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    hits_before = counter(cached_server, "prefix_cache_hits")
    turn_two = turn_one + [{"role": "assistant", "content": first.choices[0].message.content},
                           {"role": "user", "content": "and subtract?"}]
    second = chat(cached_server, turn_two, stream=True, stream_options={"include_usage": True})
    chunks = list(second)
    cached = chunks[-1].usage.prompt_tokens_details.cached_tokens
    assert cached > 0  # at least turn one's prompt
    assert counter(cached_server, "prefix_cache_hits") == hits_before + cached
    assert counter(cached_server, "prefix_cache_queries") >= chunks[-1].usage.prompt_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tok = tiny_target.tokenizer
    ids = tok(tok.apply_chat_template(turn_two, tokenize=False, add_generation_prompt=True),
              add_special_tokens=False)["input_ids"]
    truth = greedy_reference(ids, 12)
    truth = truth[:next((i + 1 for i, t in enumerate(truth) if t in tiny_target.eos_ids), len(truth))]
    assert text == tok.decode(truth, skip_special_tokens=True)  # the target's own greedy answer
    with running_server(tiny_model_dir, prefix_cache_bytes=0, max_context_tokens=512, http_port=0) as plain:
        reply = chat(plain, turn_two)
        assert reply.choices[0].message.content == text
        assert reply.usage.prompt_tokens_details is None  # no cache: no details, as vLLM without them
        assert plain.core.prefix_cache is None


def test_a_second_open_of_the_same_prompt_restores_it(cached_server, fingerprint):
    prompt = list(range(20, 60))
    with grpc.insecure_channel(cached_server.address) as channel:
        with ServerStream(channel) as stream:
            opened = stream.send(open=pb.Open(prompt_ids=prompt, tokenizer_fingerprint=fingerprint)).opened
            assert opened.cached_tokens == 0
            stream.send(close=pb.Close(session_id=opened.session_id))
        with ServerStream(channel) as stream:
            again = stream.send(open=pb.Open(prompt_ids=prompt + [5], tokenizer_fingerprint=fingerprint)).opened
            assert again.cached_tokens == len(prompt)
        with ServerStream(channel) as stream:
            same = stream.send(open=pb.Open(prompt_ids=prompt, tokenizer_fingerprint=fingerprint)).opened
            assert same.cached_tokens == len(prompt) - 1  # the last prompt token is fed for the first token
            assert same.first_token == opened.first_token


def test_the_flag_sets_the_budget_and_refuses_a_negative_one():
    from edgespec.cli import build_parser

    parser = build_parser()
    assert server_config(parser.parse_args(["server", "m"])).prefix_cache_bytes == 2 << 30
    assert server_config(parser.parse_args(["server", "m", "--prefix-cache-gb", "0"])).prefix_cache_bytes == 0
    with pytest.raises(SystemExit, match="prefix-cache-gb"):
        server_config(parser.parse_args(["server", "m", "--prefix-cache-gb", "-1"]))
