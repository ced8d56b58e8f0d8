"""The independent drafter with weight-only int8 Linear layers: close to float, and lossless end to end."""
from __future__ import annotations

import pytest
import torch
from support.clients import generate_exactly

from edgespec.client.drafters.base import DraftRequest
from edgespec.client.drafters.independent import IndependentConfig, IndependentDrafter
from edgespec.client.drafters.int8_linear import Int8Linear, head_rows, int8_matmul_available
from edgespec.client.drafters.quantize import quantize_linears
from edgespec.client.drafters.tree_builder import TreeShape
from edgespec.client.loop.generation import TokenOrigin

pytestmark = pytest.mark.skipif(not int8_matmul_available(), reason="this torch has no _weight_int8pack_mm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_is_close_to_the_float_layer(dtype):
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(64, 48, bias=True).to(dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=g))
        lin.bias.copy_(torch.randn(48, generator=g))
    q = Int8Linear.from_weight(lin.weight, lin.bias)
    x = torch.randn(2, 5, 64, generator=g).to(dtype)
    want, got = lin(x).float(), q(x).float()
    assert got.shape == (2, 5, 48)
    rel = (got - want).norm() / want.norm()
    assert rel < (0.02 if dtype is torch.float32 else 0.03)
    rows = torch.tensor([3, 7, 40])
    assert torch.allclose(q.rows(rows)(x).float(), got[..., rows], atol=1e-2, rtol=1e-2)


def test_kept_float_weight_serves_calls_of_many_rows_and_int8_the_few():
    from edgespec.client.drafters.int8_linear import FLOAT_ROWS_FROM

    lin = torch.nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    q = Int8Linear.from_weight(lin.weight, lin.bias, keep_float=True)
    plain = Int8Linear.from_weight(lin.weight, lin.bias)
    assert q.weight_float is not None and "weight_float" not in q.state_dict()  # the model's own, never saved
    many = torch.randn(FLOAT_ROWS_FROM, 64).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(q(many), lin(many))  # exactly the 16-bit product
        assert torch.equal(q(many[:2]), plain(many[:2]))  # the int8 kernel
        assert not torch.equal(plain(many), lin(many))
    cut = q.rows(torch.tensor([0, 5]))
    with torch.no_grad():
        assert torch.equal(cut(many), lin(many)[:, [0, 5]])


def test_head_rows_cuts_a_float_head():
    lin = torch.nn.Linear(8, 10, bias=False)
    x = torch.randn(3, 8)
    rows = torch.tensor([1, 4, 9])
    assert head_rows(lin, None) is lin
    assert torch.allclose(head_rows(lin, rows)(x), lin(x)[:, rows])


def test_quantized_tiny_drafter_agrees_with_float_and_keeps_its_cache_right(tiny_drafter_dir):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.float32).eval()
    assert quantize_linears(model) == 2 * 7 + 1  # q k v o gate up down per layer, and the LM head
    assert isinstance(model.get_output_embeddings(), Int8Linear)
    ctx = list(range(40, 80))
    with torch.inference_mode():
        a = ref(input_ids=torch.tensor([ctx])).logits[0].argmax(-1)
        b = model(input_ids=torch.tensor([ctx])).logits[0].argmax(-1)
    assert (a == b).float().mean() > 0.9
    drafter = IndependentDrafter(model, IndependentConfig(TreeShape(branch=2, depth=4, max_nodes=10, min_prob=0.0)))
    tree = drafter.propose(DraftRequest(ctx, 255, 10))
    tree.validate()
    # the committed text's KV first, the tree's fed frontier nodes behind it (kept for the next sync)
    assert len(tree) == 10 and drafter._fed == ctx and drafter._cache.get_seq_length() > len(ctx)
    with torch.inference_mode():
        own = int(model(input_ids=torch.tensor([ctx])).logits[0, -1].argmax())
    assert drafter.generate_offline(ctx) == own
    assert drafter._cache.get_seq_length() == len(ctx)


def test_from_pretrained_quantizes_on_cpu_and_stays_lossless(tiny_server, tiny_model_dir, tiny_target_f32, greedy):
    """The target's own weights, bf16 loaded and stored int8, as drafter: drafts accepted, output token-exact."""
    drafter = IndependentDrafter.from_pretrained(str(tiny_model_dir), IndependentConfig(), dtype="bfloat16")
    assert isinstance(drafter.model.get_output_embeddings(), Int8Linear)
    assert drafter.model.get_output_embeddings().weight_float is not None  # kept for the prompt's prefill
    for config, dtype in ((IndependentConfig(int8_weights=False), "bfloat16"), (IndependentConfig(), "float32")):
        plain = IndependentDrafter.from_pretrained(str(tiny_model_dir), config, dtype=dtype)
        assert isinstance(plain.model.get_output_embeddings(), torch.nn.Linear)  # full precision asked for
    result = generate_exactly(drafter, tiny_server.address, tiny_model_dir, tiny_target_f32, greedy,
                              "class Queue:\n    def push(self, x):\n")
    accepted = sum(o is TokenOrigin.ACCEPTED for o in result.origins)
    assert accepted >= len(result.token_ids) // 2


def test_from_model_quantizes_a_copy_and_leaves_the_shared_model_alone(tiny_drafter_dir):
    from transformers import AutoModelForCausalLM

    shared = AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.bfloat16).eval()
    drafter = IndependentDrafter.from_model(shared, IndependentConfig())
    assert isinstance(drafter.model.get_output_embeddings(), Int8Linear)
    assert isinstance(shared.get_output_embeddings(), torch.nn.Linear)  # still usable as a bf16 baseline
    assert IndependentDrafter.from_model(shared, IndependentConfig(int8_weights=False)).model is shared
    assert len(drafter.propose(DraftRequest(list(range(40, 60)), 255, 4))) > 0
