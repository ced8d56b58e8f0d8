"""Client test fixtures: a real tiny server on loopback, netem's relay in front of it, greedy references.
(make_client is the shared one: tests/support/clients.py.)"""
from __future__ import annotations

import pytest
import torch
from support.relays import relay_to
from support.servers import running_server


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    """A real verification server (float32 tiny target) on loopback gRPC, no HTTP side."""
    with running_server(tiny_model_dir, http_port=None) as handle:
        yield handle


@pytest.fixture
def relay(tiny_server):
    """netem's relay (ideal profile) in front of the tiny server: the link a test cuts and restores."""
    with relay_to(tiny_server) as r:
        yield r


@pytest.fixture(scope="session")
def tiny_target_f32(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_drafter_f32(tiny_drafter_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.float32).eval()


@torch.inference_mode()
def _greedy(model, ids: list[int], max_new: int, eos: set[int]) -> list[int]:
    """Plain greedy decoding with a KV cache: the reference every test compares against."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out: list[int] = []
    feed = list(ids)
    pos = 0
    for _ in range(max_new):
        logits = model(input_ids=torch.tensor([feed]), position_ids=torch.arange(pos, pos + len(feed))[None],
                       past_key_values=cache, use_cache=True).logits[0, -1]
        pos += len(feed)
        token = int(logits.argmax())
        out.append(token)
        if token in eos:
            break
        feed = [token]
    return out


@pytest.fixture(scope="session")
def greedy():
    """greedy(model, prompt_ids, max_new, eos_ids) -> generated ids (EOS included when reached)."""
    return _greedy
