"""The architecture matrix: each tiny model is verified token-exact through a real server, or refused at start.

Qwen2, Llama, Phi-3 and Qwen3 are plain full attention. Mistral (sliding window on
every layer) and Gemma2 (alternating sliding and full layers, logit soft-capping)
run with the window switched off and the context capped at the window, which is
exact; asking for more context than the window is refused when the server starts.
"""
from __future__ import annotations

import pytest
import torch

from edgespec.client.drafters.tree_builder import TreeShape
from edgespec.client.loop.generation import GenerationConfig
from edgespec.server.app import start_server
from edgespec.server.architectures import UnsupportedModelError, adapt_for_tree_verification
from edgespec.shared.models.tiny import ARCHITECTURES, TinyConfig, tiny_model, tiny_tokenizer
from support.greedy import recomputed_greedy
from support.servers import running_server, tiny_server_config

PROMPT = "def add(a, b):\n    return a + b\n"


def _save(tmp_path_factory, arch: str, extra_eos: int | None = None):
    out = tmp_path_factory.mktemp(f"tiny-{arch}")
    model = tiny_model(TinyConfig(arch=arch))
    if extra_eos is not None:
        model.generation_config.eos_token_id = [258, extra_eos]
    model.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


@pytest.fixture
def client_for(make_client):
    """client_for(address, model_dir, drafter, tree=None): a client whose tokenizer is the model's own
    (transformers may pick a tokenizer class by architecture); the deadline of a link's default, as the
    larger architectures verify slower than the tiny Qwen2."""
    return lambda address, model_dir, drafter="ngram", tree=None: make_client(
        address, drafter, drafter_dir=model_dir, tree=tree, tokenizer=model_dir, min_deadline_s=1.0)


def _plain_greedy(model_dir, ids: list[int], n: int) -> list[int]:
    """The architecture's own forward, full sequence each step, no cache: the reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    return recomputed_greedy(model, ids, n)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_tree_verification_is_token_exact(tmp_path_factory, client_for, arch):
    model_dir = _save(tmp_path_factory, arch)
    with running_server(model_dir, http_port=None) as handle:
        # The target's own weights as drafter: deep trees are accepted, so the kept-rows path runs.
        client = client_for(handle.address, model_dir, "independent",
                            tree=TreeShape(branch=2, depth=5, max_nodes=12, min_prob=0.0))
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=40, ignore_eos=True))
        assert result.token_ids == _plain_greedy(model_dir, ids, 40)
        assert result.metrics.acceptance_length > 2.0
        assert result.metrics.disconnects == 0


def test_a_context_longer_than_the_sliding_window_is_refused_at_start(tmp_path_factory):
    model_dir = _save(tmp_path_factory, "mistral")
    with pytest.raises(UnsupportedModelError, match=r"sliding attention window of 4096 tokens.*at most 4096"):
        start_server(tiny_server_config(model_dir, http_port=None, max_context_tokens=8192))


def test_a_window_caps_the_context_the_server_announces(tmp_path_factory):
    model_dir = _save(tmp_path_factory, "gemma2")
    with running_server(model_dir, http_port=None) as handle:
        assert handle.core.limits.max_context_tokens == 4096


def test_layers_that_are_not_attention_are_refused():
    model = tiny_model(TinyConfig(arch="qwen3"))
    model.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(UnsupportedModelError, match="linear_attention"):
        adapt_for_tree_verification(model)


def test_the_client_stops_on_the_servers_second_eos(tmp_path_factory, client_for):
    """A second EOS in generation_config (Phi-3's <|end|>, Gemma's <end_of_turn>) reaches the client via Info."""
    plain_dir = _save(tmp_path_factory, "qwen2")
    ids = tiny_tokenizer()(PROMPT, add_special_tokens=False)["input_ids"]
    reference = _plain_greedy(plain_dir, ids, 30)
    stop_at = next(k for k in range(5, 30) if reference[k] not in reference[:k] and reference[k] != 258)
    model_dir = _save(tmp_path_factory, "qwen2", extra_eos=reference[stop_at])
    with running_server(model_dir, http_port=None) as handle:
        client = client_for(handle.address, model_dir)
        assert reference[stop_at] in client.tokens.eos_ids
        result = client.generate(ids, GenerationConfig(max_new_tokens=30))
        assert result.token_ids == reference[:stop_at + 1]
        assert result.finish_reason != "length"
