"""An edgespec client as the tests make one: the tiny target's tokenizer and a link that gives up and
retries quickly (a loopback link answers in milliseconds)."""
from __future__ import annotations

import pytest

# LinkConfig fields of a test's link; a test passes its own to override them
QUICK_LINK = {"min_deadline_s": 0.3, "connect_timeout_s": 0.5, "backoff_initial_s": 0.02, "backoff_max_s": 0.2}


def edge_client(address: str, options, tokenizer, **link):
    """An EdgespecClient of the DrafterOptions `options` to `address`, over a QUICK_LINK with `link` on top."""
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig

    return EdgespecClient(ClientConfig(LinkConfig(address, **{**QUICK_LINK, **link}), options, tokenizer=str(tokenizer)))


def generate_exactly(drafter, address: str, tokenizer, target, greedy, prompt: str, n: int = 60):
    """A client of `address` drafting with the Drafter object `drafter` generates n tokens of `prompt`; asserts
    they are the target's greedy tokens (`greedy`, the fixture) and returns the GenerationResult."""
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig
    from edgespec.client.loop.generation import GenerationConfig

    client = EdgespecClient(ClientConfig(LinkConfig(address), DrafterOptions("independent"), tokenizer=str(tokenizer)),
                            drafter=drafter)
    try:
        ids = client.encode(prompt)
        want = greedy(target, ids, n, client.tokens.eos_ids)
        result = client.generate(ids, GenerationConfig(max_new_tokens=n))
        assert result.token_ids == want
        return result
    finally:
        client.close()


@pytest.fixture
def make_client(tiny_model_dir, tiny_drafter_dir):
    """make_client(address, drafter="ngram"|"independent", drafter_dir=None, tree=None, options=None, tokenizer=None,
    **link) -> EdgespecClient, closed after the test. The independent drafter's model is the tiny drafter (or
    drafter_dir); `options`: DrafterOptions of your own (learned drafters) instead; the tokenizer is the tiny
    target's unless given."""
    from edgespec.client.drafters.factory import DrafterOptions

    made = []

    def make(address: str, drafter: str = "ngram", drafter_dir=None, tree=None, options=None, tokenizer=None,
             **link):
        if options is None:
            options = DrafterOptions(name=drafter, model=str(drafter_dir or tiny_drafter_dir), dtype="float32")
            if tree is not None:
                options = DrafterOptions(name=drafter, model=options.model, dtype="float32", tree=tree)
        made.append(edge_client(address, options, tokenizer or tiny_model_dir, **link))
        return made[-1]

    yield make
    for c in made:
        c.close()
