"""The independent drafter in float32 on a CPU (one without native bf16, where int8 weights do not apply) holds
its linears packed for oneDNN (shared/packed_weights.py): the same trees as without, and lossless end to end."""
from __future__ import annotations

import pytest
import torch
from support.clients import generate_exactly

from edgespec.client.drafters.base import DraftRequest
from edgespec.client.drafters.independent import IndependentConfig, IndependentDrafter
from edgespec.client.loop.generation import TokenOrigin
from edgespec.shared.packed_weights import PackedLinear, is_packed

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def _drafter(tiny_model_dir, packed: bool | None) -> IndependentDrafter:
    return IndependentDrafter.from_pretrained(str(tiny_model_dir), IndependentConfig(packed_weights=packed),
                                              dtype="float32")


def test_a_float32_drafter_packs_its_layers_and_its_draft_head_not_the_full_head(tiny_model_dir):
    drafter = _drafter(tiny_model_dir, None)
    layer = drafter.model.model.layers[0]
    assert isinstance(layer.mlp.gate_proj, PackedLinear) and isinstance(layer.self_attn.q_proj, PackedLinear)
    assert type(drafter.model.get_output_embeddings()) is torch.nn.Linear  # one row at a time: offline only
    assert isinstance(drafter._draft_head, PackedLinear)
    assert not is_packed(_drafter(tiny_model_dir, False).model)


def test_packed_and_unpacked_drafters_draft_the_same_trees(tiny_model_dir):
    packed, plain = _drafter(tiny_model_dir, None), _drafter(tiny_model_dir, False)
    for prompt in ([72, 101, 108, 108, 111, 32], list(range(40, 90)), [5] * 12):
        request = DraftRequest(committed=prompt, max_nodes=24, max_depth=6)
        a, b = packed.propose(request), plain.propose(request)
        assert len(a.tokens) > 1
        assert (a.tokens, a.parents) == (b.tokens, b.parents)
        assert packed._scores == pytest.approx(plain._scores, abs=1e-4)


def test_the_packed_drafter_stays_lossless(tiny_server, tiny_model_dir, tiny_target_f32, greedy):
    drafter = _drafter(tiny_model_dir, None)
    result = generate_exactly(drafter, tiny_server.address, tiny_model_dir, tiny_target_f32, greedy,
                              "class Queue:\n    def push(self, x):\n")
    assert sum(o is TokenOrigin.ACCEPTED for o in result.origins) >= len(result.token_ids) // 2
