"""Client test fixtures: a real tiny server on loopback, netem's relay in front of it, greedy references.
(make_client is the shared one: tests/support/clients.py.)"""
from __future__ import annotations

import pytest
import torch
from support.greedy import greedy_continuation
from support.relays import relay_to
from support.servers import running_server


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    """A real verification server (float32 tiny target) on loopback gRPC, no HTTP side."""
    with running_server(tiny_model_dir, http_port=None) as handle:
        yield handle


@pytest.fixture(scope="module")
def core(tiny_model_dir):
    """The verification core in-process (float32 tiny target), for InProcessTransport: a module's worth."""
    from edgespec.server.core import CoreLimits, VerifierCore
    from edgespec.server.target import TargetModel
    from edgespec.shared.models.loading import load_model

    core = VerifierCore(TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32")), CoreLimits())
    yield core
    core.close_all()


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


@pytest.fixture(scope="session")
def greedy():
    """greedy(model, prompt_ids, max_new, eos_ids) -> generated ids (EOS included when reached): plain greedy
    decoding with a KV cache, the reference every test compares against."""
    return greedy_continuation
