"""The HTTP side: health, Prometheus metrics, and the OpenAI-compatible plain API driven by the openai client."""
from __future__ import annotations

import httpx
import pytest

from edgespec.proto.edgespec.v1 import pb
from edgespec.server.text_stream import TextStream
from edgespec.shared.tree import ROOT, DraftTree, encode_tree


@pytest.fixture
def openai_client(tiny_server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{tiny_server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)


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
    assert values["edgespec_verifications_total"] >= 1
    assert values["edgespec_draft_tokens_total"] >= 2
    assert values["edgespec_bytes_in_total"] > 0 and values["edgespec_bytes_out_total"] > 0
    assert values["edgespec_acceptance_length_count"] >= 1
    assert values["edgespec_verify_latency_seconds_count"] >= 1
    assert "edgespec_sessions" in values


def test_completions_with_token_ids_equal_the_target_greedy_output(openai_client, greedy_reference, tiny_target):
    prompt = [104, 105, 32, 116]
    reply = openai_client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
    truth = until_eos(greedy_reference(prompt, 24))
    assert reply.usage.completion_tokens == len(truth) and reply.usage.prompt_tokens == 4
    assert reply.choices[0].text == tiny_target.tokenizer.decode(truth, skip_special_tokens=True)
    assert reply.choices[0].finish_reason == ("length" if len(truth) == 24 else "stop")


def test_streamed_completion_equals_the_whole_one(openai_client):
    kwargs = dict(model="tiny", prompt="def add(a, b):", max_tokens=20, temperature=0)
    whole = openai_client.completions.create(**kwargs).choices[0].text
    chunks = list(openai_client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_chat_completions_stream_and_whole(openai_client, tiny_target, greedy_reference):
    messages = [{"role": "user", "content": "hello"}]
    whole = openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    text = tiny_target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tiny_target.tokenizer(text, add_special_tokens=False)["input_ids"]
    truth = until_eos(greedy_reference(ids, 12))
    assert whole.choices[0].message.content == tiny_target.tokenizer.decode(truth, skip_special_tokens=True)
    stream = openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                   stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == whole.choices[0].message.content


def test_sampled_completions_are_reproducible_by_seed(openai_client):
    kwargs = dict(model="tiny", prompt=[1, 2, 3], max_tokens=16, temperature=1.0, top_p=0.9)
    a = openai_client.completions.create(seed=5, **kwargs).choices[0].text
    b = openai_client.completions.create(seed=5, **kwargs).choices[0].text
    assert a == b


def test_bad_api_requests_are_refused_with_a_reason(tiny_server):
    url = f"{tiny_server.http_url}/v1/completions"
    reply = httpx.post(url, json={"prompt": [999], "max_tokens": 2})
    assert reply.status_code == 400 and "vocabulary" in reply.json()["detail"]
    reply = httpx.post(url, json={"prompt": "x", "temperature": -1})
    assert reply.status_code == 422


class ByteTokenizer:
    """Decodes ids as UTF-8 bytes, like a byte-level BPE: a character may span tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_text_stream_waits_for_whole_characters():
    stream = TextStream(ByteTokenizer())
    ids = list("añb".encode())
    deltas = [stream.push(i) for i in ids]
    assert deltas == ["a", "", "ñ", "b"] and stream.finish() == ""


def test_text_stream_holds_back_a_possible_stop_string_and_cuts_at_it():
    stream = TextStream(ByteTokenizer(), stop=["END"])
    out = [stream.push(i) for i in b"xyEN"]
    assert "".join(out) == "xy"  # "EN" might start "END"
    assert stream.push(ord("D")) == "" and stream.stopped
    assert stream.finish() == ""
    stream = TextStream(ByteTokenizer(), stop=["END"])
    out = [stream.push(i) for i in b"ENx"]
    assert "".join(out) + stream.finish() == "ENx" and not stream.stopped
