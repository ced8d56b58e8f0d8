"""The text-level Python client against a real tiny server: token-exact with the target's greedy output."""
from __future__ import annotations

import asyncio

import pytest

from edgespec.client import AsyncClient, Client

MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]
LINK = {"min_deadline_s": 0.3, "connect_timeout_s": 0.5}


@pytest.fixture(scope="module")
def client(tiny_server, tiny_model_dir, tiny_drafter_dir):
    with Client(server=tiny_server.address, drafter="independent", drafter_model=str(tiny_drafter_dir),
                tokenizer=str(tiny_model_dir), **LINK) as c:
        yield c


@pytest.fixture
def expected(tiny_tokenizer, tiny_target_f32, greedy):
    """ids -> (the target's greedy ids, their text)."""
    from edgespec.client.edge_client import eos_ids

    def run(ids, n):
        want = greedy(tiny_target_f32, ids, n, eos_ids(tiny_tokenizer))
        return want, tiny_tokenizer.decode(want, skip_special_tokens=True)

    return run


def test_chat_is_the_targets_greedy_answer_whole_and_streamed(client, tiny_tokenizer, expected):
    ids = client.edge.encode_chat(MESSAGES)
    want_ids, want_text = expected(ids, 20)
    text = client.chat(MESSAGES, max_tokens=20, temperature=0)
    assert isinstance(text, str) and text == want_text
    assert client.last_result.token_ids == want_ids
    assert client.last_result.metrics.num_drafts >= 1  # it really went through the speculative loop
    pieces = list(client.chat(MESSAGES, stream=True, max_tokens=20, temperature=0))
    assert len(pieces) > 1 and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == want_text and client.last_result.token_ids == want_ids


def test_complete_with_a_stop_string_and_the_ngram_drafter(tiny_server, tiny_model_dir, tiny_tokenizer, expected):
    prompt = "def add(a, b):\n"
    want_ids, want_text = expected(tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"], 16)
    with Client(tiny_server.address, "ngram", tokenizer=str(tiny_model_dir), **LINK) as c:
        assert c.model_name
        assert c.complete(prompt, max_tokens=16, temperature=0) == want_text
        assert c.last_result.token_ids == want_ids
        stop = want_text[len(want_text) // 2:][:3]  # a piece of the answer, so it must cut there
        cut = c.complete(prompt, max_tokens=16, stop=stop, temperature=0)
        assert cut == want_text[: want_text.index(stop)]


def test_async_client_chat_and_stream(tiny_server, tiny_model_dir, tiny_drafter_dir, tiny_tokenizer, expected):
    from edgespec.client.edge_client import chat_prompt_ids

    want_ids, want_text = expected(chat_prompt_ids(tiny_tokenizer, MESSAGES), 12)

    async def go():
        async with AsyncClient(tiny_server.address, "independent", drafter_model=str(tiny_drafter_dir),
                               tokenizer=str(tiny_model_dir), **LINK) as client:
            whole = await client.chat(MESSAGES, max_tokens=12, temperature=0)
            pieces = [p async for p in await client.chat(MESSAGES, stream=True, max_tokens=12, temperature=0)]
            completed = await client.complete("x = 1\n", max_tokens=5)
            return whole, pieces, completed, client.last_result

    whole, pieces, completed, last = asyncio.run(go())
    assert whole == want_text and "".join(pieces) == want_text and len(pieces) > 1
    assert isinstance(completed, str) and last.metrics.new_tokens == len(last.token_ids) <= 5


def test_async_stream_abandoned_early_frees_the_client(tiny_server, tiny_model_dir):
    async def go():
        async with AsyncClient(tiny_server.address, "ngram", tokenizer=str(tiny_model_dir), **LINK) as client:
            stream = await client.complete("def f(x):\n", stream=True, max_tokens=30)
            async for _ in stream:
                break
            await stream.aclose()
            # the lock is free again: a second request runs to the end
            return await asyncio.wait_for(client.complete("def g(y):\n", max_tokens=4), timeout=60)

    assert isinstance(asyncio.run(go()), str)


def test_bad_sampling_option_is_named(client):
    with pytest.raises(TypeError, match="'temprature' is not a sampling option .*did you mean 'temperature'"):
        client.chat(MESSAGES, temprature=0.5)
    with pytest.raises(TypeError, match="'max_new_tokens' is not a sampling option.*max_tokens"):
        client.complete("x", max_new_tokens=3)


def test_a_bad_sampling_setting_is_refused_by_the_client_before_anything_is_sent(client, tiny_server):
    """The client refuses it where it is given, naming it, as the server would; not one byte goes out."""
    registry = tiny_server.core.metrics.registry
    sent = registry.get_sample_value("edgespec_bytes_in_total")
    with pytest.raises(ValueError, match=r"^top_p must be in \[0, 1\], got 2$"):
        client.chat(MESSAGES, top_p=2)
    with pytest.raises(ValueError, match=r"^temperature must be >= 0 \(0 = greedy\), got -1$"):
        client.complete("x", temperature=-1)
    assert registry.get_sample_value("edgespec_bytes_in_total") == sent


def test_default_temperature_is_the_http_apis_one(client):
    """1, as OpenAI's and vLLM's (and both edgespec HTTP APIs'): the session is opened sampling."""
    from edgespec.shared.openai.requests import CompletionRequest

    http = CompletionRequest(prompt="x").settings().sampling
    assert client._config().sampling.temperature == http.temperature == 1.0


def test_logprobs_are_the_targets_for_every_token_of_the_answer(client, tiny_target_f32):
    import torch

    text = client.chat(MESSAGES, max_tokens=12, logprobs=2, temperature=0)
    r = client.last_result
    assert text and len(r.logprobs) == len(r.token_ids)
    ids = client.edge.encode_chat(MESSAGES)
    with torch.inference_mode():  # one full forward: row i - 1 scores token i
        rows = torch.log_softmax(tiny_target_f32(torch.tensor([ids + r.token_ids])).logits[0].float(), -1)
    for i, (token, lp) in enumerate(zip(r.token_ids, r.logprobs)):
        row = rows[len(ids) + i - 1]
        assert lp.logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert [t for t, _ in lp.top] == row.topk(2).indices.tolist()
    with pytest.raises(ValueError, match="logprobs must be between 0 and 20"):
        client.chat(MESSAGES, logprobs=21)
