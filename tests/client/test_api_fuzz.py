"""No body a caller can send gets a 5xx from either OpenAI-compatible API, and both answer it alike.

Hypothesis posts JSON objects with random values (any JSON type, NaN and infinities included) in every
field both endpoints know, plus unknown fields, to the server's plain API and to the client's local
API, in this process on real sockets.
"""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.asgi_server import serving
from support.servers import running_server

pytestmark = pytest.mark.slow  # hypothesis runs hundreds of requests through both APIs

json_scalar = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats()
               | st.text(max_size=12) | st.sampled_from(["", "text", "none", "user", "\ud800"]))
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def field(*plausible) -> st.SearchStrategy:
    """A field's value: often plausible, sometimes anything at all."""
    return st.one_of(*plausible, json_value)


part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])}, optional={"text": json_value})
message = st.fixed_dictionaries(
    {"role": field(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))},
    optional={"content": field(st.text(max_size=20), st.lists(part, max_size=2)), "name": json_value,
              "tool_calls": json_value})
FIELDS = {
    "model": field(st.just("MODEL")),
    "prompt": field(st.text(max_size=20), st.lists(st.integers(-2, 400), max_size=5), st.lists(st.text(max_size=5),
                                                                                               max_size=2)),
    "messages": field(st.lists(message, max_size=3)),
    "max_tokens": field(st.integers(-1, 6)), "max_completion_tokens": field(st.integers(-1, 6)),
    "temperature": field(st.floats(-1, 3)), "top_p": field(st.floats(-0.5, 1.5)), "top_k": field(st.integers(-2, 5)),
    "n": field(st.integers(0, 3)), "stream": field(st.booleans()),
    "stream_options": field(st.fixed_dictionaries({}, optional={"include_usage": json_value})),
    "stop": field(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)),
    "seed": field(st.integers(-(2 ** 64), 2 ** 65)),
    "logprobs": field(st.booleans(), st.integers(-1, 6)), "top_logprobs": field(st.integers(-1, 21)),
    "echo": json_value, "best_of": json_value, "suffix": json_value, "logit_bias": json_value, "tools": json_value,
    "tool_choice": json_value, "response_format": json_value, "frequency_penalty": json_value,
    "presence_penalty": json_value, "user": json_value, "stream_options_typo": json_value,
    "min_p": json_value, "repetition_penalty": json_value, "ignore_eos": json_value,
    "parallel_tool_calls": json_value,
}

def some_fields(most: int) -> st.SearchStrategy:
    one = st.sampled_from(sorted(FIELDS)).flatmap(lambda name: FIELDS[name].map(lambda value: (name, value)))
    return st.lists(one, max_size=most).map(dict)


def bodies(valid: dict) -> st.SearchStrategy:
    """Anything in every field, or a valid request with a few fields made random (to reach generation)."""
    return st.one_of(st.fixed_dictionaries({}, optional=FIELDS),
                     st.builds(lambda base, extra: {**base, **extra}, st.fixed_dictionaries(valid), some_fields(2)))


completion_bodies = bodies({"model": st.just("MODEL"), "prompt": st.text(min_size=1, max_size=10),
                            "max_tokens": st.integers(1, 4)})
chat_bodies = bodies({"model": st.just("MODEL"), "max_tokens": st.integers(1, 4),
                      "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"),
                                                                  "content": st.text(max_size=10)}),
                                           min_size=1, max_size=2)})


class Both:
    def __init__(self, server, client_url: str):
        self.model = server.core.target.name
        self.urls = {"server": f"{server.http_url}/v1", "client": client_url}
        self.http = httpx.Client(timeout=120)


@pytest.fixture(scope="module")
def both(tiny_model_dir):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.http_api import build_app
    from edgespec.client.link.grpc_transport import LinkConfig

    with running_server(tiny_model_dir, max_context_tokens=256) as server:
        client = EdgespecClient(ClientConfig(LinkConfig(server.address), DrafterOptions("ngram"),
                                             tokenizer=str(tiny_model_dir)))
        with serving(build_app(client), log_level="critical") as url:
            yield Both(server, f"{url}/v1")
        client.close()


def answer(both: Both, side: str, path: str, raw: bytes) -> tuple[int, str]:
    """Status and body; a stream is read to its end (an error in it must not be a server error either)."""
    with both.http.stream("POST", f"{both.urls[side]}/{path}", content=raw,
                          headers={"content-type": "application/json"}) as reply:
        text = reply.read().decode("utf-8", "replace")
    return reply.status_code, text


def check(both: Both, path: str, body: dict) -> None:
    if body.get("model") == "MODEL":
        body["model"] = both.model
    raw = json.dumps(body).encode()  # NaN and Infinity travel as the bare words Python writes
    got = {side: answer(both, side, path, raw) for side in both.urls}
    for side, (status, text) in got.items():
        assert status < 500, f"{side} {path} {raw[:300]!r} -> {status} {text[:300]}"
        assert '"server_error"' not in text, f"{side} {path} {raw[:300]!r} -> {text[:300]}"
    statuses = {side: status for side, (status, _) in got.items()}
    event(f"server {statuses['server']}")  # --hypothesis-show-statistics: how many bodies got how far
    logprobs = body.get("logprobs") not in (None, False)  # the client refuses them, by design
    if not logprobs:
        assert statuses["server"] == statuses["client"], f"{path} {raw[:300]!r}: {got}"


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])


@FUZZ
@given(body=completion_bodies)
def test_random_completion_bodies_get_no_5xx_on_either_api(both, body):
    check(both, "completions", body)


@FUZZ
@given(body=chat_bodies)
def test_random_chat_bodies_get_no_5xx_on_either_api(both, body):
    check(both, "chat/completions", body)


@FUZZ
@given(raw=json_value)
def test_random_json_of_any_shape_gets_no_5xx(both, raw):
    for path in ("completions", "chat/completions"):
        for side in both.urls:
            status, text = answer(both, side, path, json.dumps(raw).encode())
            assert status < 500, f"{side} {path} {raw!r} -> {status} {text[:300]}"
