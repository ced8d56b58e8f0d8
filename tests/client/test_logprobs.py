"""Logprobs on the local API when the link drops, over real sockets: netem's relay (3G delays) in front of a
real server, the local API on real HTTP. Tokens the target verified carry its log-probabilities; tokens it
never saw (the link did not come back) go out last, with null, and the answer counts them."""
from __future__ import annotations

import json

import httpx
import pytest
from support.asgi_server import serving
from support.relays import relay_to

PROMPT = "def add(a, b):\n    return a + b\n"


def stream_entries(url: str, on_first) -> tuple[list[dict], dict]:
    """A streamed completion's logprob entries (chat shape) and its `edgespec` extra; on_first() runs when
    the first token arrives."""
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 2, "stream": True}
    tokens, extra = [], {}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            for choice in chunk["choices"]:
                lp = choice.get("logprobs")
                if lp and lp["tokens"]:
                    if not tokens:
                        on_first()
                    tokens += [dict(token=t, logprob=v, top=top) for t, v, top in
                               zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])]
            extra = chunk.get("edgespec", extra)
    return tokens, extra


def test_tokens_the_target_never_saw_come_last_with_null_logprobs(tiny_server, make_client):
    from edgespec.client.http_api import build_app

    with relay_to(tiny_server, "3g") as relay:
        client = make_client(relay.target, "independent")
        with serving(build_app(client, offline_wait_s=0.3)) as url:
            tokens, extra = stream_entries(url, lambda: relay.cut("reset"))
    unseen = [t for t in tokens if t["logprob"] is None]
    assert len(tokens) == 12 and extra["provisional_tokens"] == len(unseen) > 0
    assert tokens[0]["logprob"] is not None and len(tokens[0]["top"]) == 2  # Opened carried the first token's
    assert tokens[-len(unseen):] == unseen  # held back until the end: a verified token never follows one
    assert all(t["top"] == {} for t in unseen)
    assert all(t["logprob"] <= 0 for t in tokens if t["logprob"] is not None)


def test_the_server_refuses_more_alternatives_than_the_wire_carries(tiny_server, make_client):
    """The API layer caps top_logprobs at 20 and so does the server (a client of its own may ask for more)."""
    from edgespec.client.loop.generation import GenerationConfig, GenerationFailedError

    client = make_client(tiny_server.address, "ngram")
    with pytest.raises(ValueError, match="between 0 and 20"):  # this client's own check
        GenerationConfig(logprobs=21)
    config = GenerationConfig(max_new_tokens=4, logprobs=20)
    object.__setattr__(config, "logprobs", 21)  # a client without that check
    with pytest.raises(GenerationFailedError, match="at most 20 alternatives"):
        client.generate(client.encode(PROMPT), config)
