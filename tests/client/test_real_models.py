"""Client + server on loopback with the real models: greedy output equals the 1.5B target's own."""
from __future__ import annotations

import pytest
import torch

from edgespec.client.loop.generation import GenerationConfig
from support.greedy import greedy_continuation
from support.servers import running_server

pytestmark = [pytest.mark.models, pytest.mark.slow]  # the real models

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]


@pytest.fixture(scope="module")
def real_server():
    torch.set_num_threads(2)
    # the default dtype (default_dtype), under an alias: clients still find the tokenizer by the registry name
    with running_server("qwen2.5-coder-1.5b-instruct", http_port=None, dtype=None, served_model_name="coder") as handle:
        yield handle


@pytest.mark.parametrize("drafter", ["ngram", "independent"])
def test_real_models_greedy_equals_target(real_server, drafter):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig

    link = LinkConfig(real_server.address, min_deadline_s=120, max_deadline_s=600)  # a busy CPU is not a dead link
    with EdgespecClient(ClientConfig(link, DrafterOptions(drafter))) as client:
        for prompt in PROMPTS:
            ids = client.encode_chat([{"role": "user", "content": prompt}])
            result = client.generate(ids, GenerationConfig(max_new_tokens=32))
            want = greedy_continuation(real_server.core.target.model, ids, 32, client.tokens.eos_ids)
            assert result.token_ids == want, (client.decode(result.token_ids), client.decode(want))
            assert result.metrics.disconnects == 0


def test_a_served_alias_still_names_the_tokenizer(real_server, tiny_drafter_dir):
    """The ngram drafter has no model of its own to take the tokenizer from: a drafter model with another
    tokenizer beside it would be refused, if the client did not load the registry name Info gives."""
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig
    from edgespec.shared.fingerprint import tokenizer_fingerprint

    link = LinkConfig(real_server.address, min_deadline_s=120, max_deadline_s=600)
    with EdgespecClient(ClientConfig(link, DrafterOptions("ngram", model=str(tiny_drafter_dir)))) as client:
        assert (client.model_name, client.info.registry_name) == ("coder", "qwen2.5-coder-1.5b-instruct")
        assert tokenizer_fingerprint(client.tokenizer) == client.info.tokenizer_fingerprint
