"""The shipped learned drafters with the real 1.5B target: they load by name on both sides
(client drafter, server part), fit the target's tokenizer, and drafted generation over gRPC is
token-exact with the target's own greedy decoding (float32 target, so no bf16 near-ties)."""
from __future__ import annotations

import pytest
import torch
from support.servers import running_server

from edgespec.shared.drafters.checkpoint import shipped_names

pytestmark = [pytest.mark.models, pytest.mark.slow]  # the real 1.5B target
TARGET = "qwen2.5-coder-1.5b-instruct"
PROMPT = "Write a Python function that returns the squares of a list of numbers."


@pytest.fixture(scope="module")
def server():
    torch.set_num_threads(2)
    parts = {n: n for n in shipped_names() if n.startswith("moa")}
    with running_server(TARGET, http_port=None, moa_server_parts=parts) as handle:  # float32: no bf16 near-ties
        yield handle


@pytest.mark.parametrize("name", shipped_names())
def test_shipped_drafter_by_name_is_exact_with_the_real_target(server, name):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig
    from edgespec.client.loop.generation import GenerationConfig

    link = LinkConfig(server.address, min_deadline_s=120, max_deadline_s=600)
    with EdgespecClient(ClientConfig(link, DrafterOptions(name))) as client:
        assert client.drafter.name == name
        ids = client.encode_chat([{"role": "user", "content": PROMPT}])
        result = client.generate(ids, GenerationConfig(max_new_tokens=24, ignore_eos=True))
        with torch.inference_mode():
            out = server.core.target.model.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24,
                                                    do_sample=False, temperature=None, top_p=None, top_k=None)
        assert result.token_ids == out[0, len(ids):].tolist()
        assert result.metrics.num_accepted_tokens > 0  # the drafter predicts the target, at least sometimes
