"""The independent drafter's MLP in int4 (groups of 64 input channels): the codes, the kernel against them,
the layers chosen, and a drafter that stays lossless end to end."""
from __future__ import annotations

import pytest
import torch
from support.clients import generate_exactly

from edgespec.client.drafters.base import DraftRequest
from edgespec.client.drafters.independent import IndependentConfig, IndependentDrafter, weights_config
from edgespec.client.drafters.int4_linear import (Int4Linear, dequantize_groups, fits_int4, int4_matmul_available,
                                                  quantize_groups)
from edgespec.client.drafters.int8_linear import FLOAT_ROWS_FROM, Int8Linear, int8_matmul_available
from edgespec.client.drafters.quantize import quantize_linears
from edgespec.client.drafters.tree_builder import TreeShape
from edgespec.client.loop.generation import TokenOrigin

pytestmark = pytest.mark.skipif(not (int4_matmul_available() and int8_matmul_available()),
                                reason="this torch has no CPU int4 / int8 weight kernels")


def test_group_codes_stay_within_half_a_step_and_a_constant_group_is_exact():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 128, generator=g)
    w[3, :64] = 0.75  # one whole group constant
    codes, scale, low = quantize_groups(w, 64)
    assert codes.shape == (32, 128) and scale.shape == low.shape == (32, 2)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    back = dequantize_groups(codes, scale, low)
    step = scale.repeat_interleave(64, dim=1)
    assert ((back - w).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(back[3, :64], w[3, :64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_kernel_computes_the_product_with_the_dequantized_weight(dtype):
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(48, 128, generator=g).to(dtype), torch.randn(48, generator=g).to(dtype)
    layer = Int4Linear.from_weight(w, b)
    x = torch.randn(2, 3, 128, generator=g).to(dtype)
    want = x.float() @ dequantize_groups(*quantize_groups(w)).t() + b.float()
    got = layer(x).float()
    assert got.shape == (2, 3, 48)
    assert (got - want).norm() / want.norm() < (1e-5 if dtype is torch.float32 else 0.01)
    # and it is a 4-bit approximation of the layer, not the layer itself
    exact = torch.nn.functional.linear(x.float(), w.float(), b.float())
    assert 0.01 < (got - exact).norm() / exact.norm() < 0.2


def test_kept_float_weight_serves_calls_of_many_rows():
    w = torch.randn(64, 64).to(torch.bfloat16)
    layer = Int4Linear.from_weight(w, keep_float=True)
    assert "weight_float" not in layer.state_dict()
    many = torch.randn(FLOAT_ROWS_FROM, 64).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(many), torch.nn.functional.linear(many, w))
        assert not torch.equal(layer(many[:2]), torch.nn.functional.linear(many[:2], w))


def test_shapes_the_kernel_cannot_take_are_refused_by_name():
    assert fits_int4(torch.zeros(64, 128)) and not fits_int4(torch.zeros(64, 96)) and not fits_int4(torch.zeros(10, 64))
    with pytest.raises(ValueError, match=r"groups of 64 input channels.*\(10, 64\)"):
        Int4Linear.from_weight(torch.zeros(10, 64))


def test_only_the_mlp_becomes_int4_and_the_drafter_agrees_with_float(tiny_drafter_dir):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.float32).eval()
    assert quantize_linears(model, int4_under="mlp") == 2 * 7 + 1
    kinds = {name: type(m) for name, m in model.named_modules() if isinstance(m, (Int4Linear, Int8Linear))}
    assert {n for n, k in kinds.items() if k is Int4Linear} == {
        f"model.layers.{i}.mlp.{p}_proj" for i in range(2) for p in ("gate", "up", "down")}
    assert kinds["lm_head"] is Int8Linear and kinds["model.layers.0.self_attn.q_proj"] is Int8Linear
    ctx = list(range(40, 80))
    with torch.inference_mode():
        a = ref(input_ids=torch.tensor([ctx])).logits[0]
        b = model(input_ids=torch.tensor([ctx])).logits[0]
    # int4 on random weights (not a 4-6 bit GGUF's) moves this tiny model's logits by ~25 %, int8 by ~4 %
    assert (b - a).norm() / a.norm() < 0.4 and (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.5
    drafter = IndependentDrafter(model, IndependentConfig(TreeShape(branch=2, depth=4, max_nodes=10, min_prob=0.0)))
    tree = drafter.propose(DraftRequest(ctx, 255, 10))
    tree.validate()
    assert len(tree) == 10


def test_weights_names_pick_the_layers(tiny_drafter_dir):
    from transformers import AutoModelForCausalLM

    shared = AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.bfloat16).eval()

    def mlp_kind(config):
        return type(IndependentDrafter.from_model(shared, config).model.model.layers[0].mlp.up_proj)

    assert IndependentConfig().weights == "int4-mlp" and mlp_kind(IndependentConfig()) is Int4Linear
    assert mlp_kind(IndependentConfig(**weights_config("int8"))) is Int8Linear
    assert mlp_kind(IndependentConfig(**weights_config("float"))) is torch.nn.Linear
    assert IndependentConfig(**weights_config("int8")).weights == "int8"
    with pytest.raises(ValueError, match="unknown drafter weights 'int2'"):
        weights_config("int2")


def test_the_default_drafter_stays_lossless(tiny_server, tiny_model_dir, tiny_target_f32, greedy):
    """The target's own weights, bf16 loaded, MLP int4 and the rest int8, as drafter: drafts accepted, output
    token-exact."""
    drafter = IndependentDrafter.from_pretrained(str(tiny_model_dir), IndependentConfig(), dtype="bfloat16")
    mlp = drafter.model.model.layers[0].mlp
    assert isinstance(mlp.gate_proj, Int4Linear) and mlp.gate_proj.weight_float is not None
    result = generate_exactly(drafter, tiny_server.address, tiny_model_dir, tiny_target_f32, greedy,
                              "class Queue:\n    def push(self, x):\n")
    accepted = sum(o is TokenOrigin.ACCEPTED for o in result.origins)
    assert accepted >= len(result.token_ids) // 2


@pytest.mark.models
def test_the_real_drafter_in_int4_mostly_picks_what_it_picks_in_bf16():
    """The 0.5B: the int4-MLP drafter's greedy choice along a real text against the bf16 model's (the int8
    drafter's agrees on ~98 %); the acceptance this costs is measured by `edgespec bench independent`."""
    import inspect
    import json.decoder

    from edgespec.shared.models import load_model

    loaded = load_model("qwen2.5-coder-0.5b-instruct", dtype="bfloat16")
    ids = torch.tensor([loaded.tokenizer(inspect.getsource(json.decoder))["input_ids"][:256]])
    drafter = IndependentDrafter.from_model(loaded.model, IndependentConfig(prefill_float=False))
    assert isinstance(drafter.model.model.layers[0].mlp.down_proj, Int4Linear)
    with torch.inference_mode():
        want = loaded.model(input_ids=ids).logits[0].argmax(-1)
        got = drafter.model(input_ids=ids).logits[0].argmax(-1)
    agree = (want == got).float().mean().item()
    print(f"int4-MLP drafter agrees with bf16 on {agree:.3f} of positions")
    assert agree > 0.9


def test_a_model_without_an_mlp_module_says_its_layers_stay_int8(caplog):
    """The int4 layers are found by the module name "mlp": a model that names its MLP otherwise is told, not
    silently left at int8."""
    from edgespec.client.drafters.independent import quantize

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.feed_forward = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 128))

    model = Block().to(torch.bfloat16)
    with caplog.at_level("WARNING", logger="edgespec.client.drafters.independent"):
        quantize(model, IndependentConfig())
    assert all(isinstance(m, Int8Linear) for m in model.feed_forward)
    assert "no linear layer under a module named 'mlp'" in caplog.text
    caplog.clear()
    named = torch.nn.Module()
    named.mlp = Block().feed_forward.to(torch.bfloat16)
    with caplog.at_level("WARNING", logger="edgespec.client.drafters.independent"):
        quantize(named, IndependentConfig())
    assert all(isinstance(m, Int4Linear) for m in named.mlp) and caplog.text == ""
