"""Fusions of the batched engine's decoder (``engine.fusion``) and the argmax on the head's own output, on the tiny
target in float32: greedy tokens and acceptance identical with and without each switch, eager and compiled; one
graph of each step part per bucket still; the matmuls and ATen ops of a decoder layer counted (printed, and the
matmul count asserted: 7 a layer unfused, 4 with merged QKV and gate-up); the switches undo themselves."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from edgespec.server.engine.base import Work
from edgespec.server.engine.batched import BatchedEngine, PoolConfig
from edgespec.server.engine.fusion import Fusion, set_fusion
from edgespec.server.target import TargetModel
from edgespec.shared.models.loading import load_model
from edgespec.shared.tree import ROOT, DraftTree

SWITCHES = {"qkv-gate-up": (Fusion(qkv=True, gate_up=True), False), "rmsnorm": (Fusion(norm=True), False),
            "bf16-argmax": (Fusion(), True), "all": (Fusion(qkv=True, gate_up=True, norm=True), True)}
MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.linear.default")


@pytest.fixture(scope="module")
def target(tiny_model_dir) -> TargetModel:
    t = TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32"))
    yield t
    set_fusion(t.model, Fusion())  # the module's target is shared: leave it as loaded


def engine(target, fusion: Fusion = Fusion(), bf16_argmax: bool = False, **kw) -> BatchedEngine:
    return BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=4, max_context_tokens=256, fusion=fusion,
                                            bf16_argmax=bf16_argmax, **kw))


def verify_run(eng: BatchedEngine, seed: int = 0, steps: int = 3) -> list:
    """Three sessions' prompts, then `steps` batches of their greedy tree verifications: each item's argmax rows,
    accepted nodes and bonus token, and the hidden states of the last batch."""
    rng = random.Random(seed)
    kvs = [eng.new_kv() for _ in range(3)]
    for kv in kvs:
        eng.run([(kv, Work.chunk([rng.randrange(300) for _ in range(rng.randint(5, 30))], 0))])
    tokens, hidden = [], None
    for _ in range(steps):
        trees = [DraftTree(tuple(rng.randrange(300) for _ in range(7)), (ROOT, 0, 0, 1, 2, ROOT, 5)) for _ in kvs]
        out = eng.run([(kv, Work.tree(rng.randrange(300), tree, len(kv), accept=True)) for kv, tree in zip(kvs, trees)])
        tokens.append([(o.best, o.accepted, o.next_token) for o in out])
        hidden = torch.cat([o.hidden for o in out]).clone()
    for kv in kvs:
        kv.close()
    return [tokens, hidden]


@pytest.mark.parametrize("switch", list(SWITCHES))
@pytest.mark.parametrize("runner", ["eager", "compiled"])
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_each_switch_keeps_greedy_tokens(target, switch, runner, attention):
    """Token-exact against the unfused eager engine (float32), hidden states within a matmul's rounding."""
    import torch._dynamo

    if runner == "compiled" and attention == "flex" and switch != "all":
        pytest.skip("the pool attention compiled: the all-on switch stands for the others")
    torch._dynamo.reset()
    small = {"block_size": 4, "max_tree_nodes": 31} if attention == "flex" else {}
    compiled = {"shape_buckets": True, "compile_backend": "aot_eager"} if runner == "compiled" else {}
    want_tokens, want_hidden = verify_run(engine(target, attention=attention, **small))
    fusion, bf16_argmax = SWITCHES[switch]
    eng = engine(target, fusion, bf16_argmax, attention=attention, **small, **compiled)
    assert eng.fusion == fusion  # every fusion asked for applies to a Qwen2
    got_tokens, got_hidden = verify_run(eng)
    assert got_tokens == want_tokens
    torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_all_switches_compiled_by_inductor_keep_greedy_tokens(target):
    import torch._dynamo

    torch._dynamo.reset()
    want_tokens, _ = verify_run(engine(target), steps=2)
    fusion, bf16_argmax = SWITCHES["all"]
    got_tokens, _ = verify_run(engine(target, fusion, bf16_argmax, shape_buckets=True, compile_backend="inductor"),
                               steps=2)
    assert got_tokens == want_tokens


def test_one_graph_of_each_part_per_bucket_with_every_fusion(target):
    """Fused, the step still compiles once per bucket part (no graph break under fullgraph, no recompile within a
    bucket): three buckets used, six graphs."""
    import torch._dynamo

    torch._dynamo.reset()
    graphs: list = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fusion, bf16_argmax = SWITCHES["all"]
    eng = engine(target, fusion, bf16_argmax, shape_buckets=True, compile_backend=counting_backend)
    used = []
    runner = eng.runner
    eng.runner = lambda flat, bucket: (used.append(bucket), runner(flat, bucket))[1]
    verify_run(eng, steps=3)
    assert len(set(used)) >= 2
    assert len(graphs) == 2 * len(set(used)), (len(graphs), set(used))


class LayerOps(TorchDispatchMode):
    """ATen ops dispatched inside decoder layer 0 (switched on by its hooks)."""

    def __init__(self):
        super().__init__()
        self.inside = False
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.inside:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def layer_ops(target, eng: BatchedEngine) -> Counter:
    layer = target.model.get_decoder().layers[0]
    counter = LayerOps()
    hooks = [layer.register_forward_pre_hook(lambda *a: setattr(counter, "inside", True)),
             layer.register_forward_hook(lambda *a: setattr(counter, "inside", False))]
    kvs = [eng.new_kv() for _ in range(2)]
    try:
        for kv in kvs:
            eng.run([(kv, Work.chunk(list(range(3, 20)), 0))])
        with counter:
            eng.run([(kv, Work.chunk([5], len(kv))) for kv in kvs])  # a decode step of two sessions
    finally:
        for h in hooks:
            h.remove()
        for kv in kvs:
            kv.close()
    return counter.ops


def test_a_layers_ops_before_and_after_each_fusion(target):
    """Printed: the ATen ops one decoder layer dispatches in a decode step per switch (the eager step's count; a
    captured graph launches about one kernel per op). Asserted: merged QKV and gate-up leave 4 matmuls of 7. The
    fused norm is torch's rms_norm, which on a CUDA build is one kernel (aten._fused_rms_norm) and on a CPU build
    decomposes into the module's own ops: here the count stays, and the GPU check's kernel count is the measure."""
    counts = {}
    for name, fusion in (("none", Fusion()), ("qkv-gate-up", Fusion(qkv=True, gate_up=True)),
                         ("rmsnorm", Fusion(norm=True)), ("all", Fusion(qkv=True, gate_up=True, norm=True))):
        counts[name] = layer_ops(target, engine(target, fusion))
    print()
    for name, ops in counts.items():
        matmuls = sum(ops[m] for m in MATMULS)
        print(f"{name}: {sum(ops.values())} ATen ops a layer, {matmuls} matmuls; {dict(ops)}")
    matmuls = {name: sum(ops[m] for m in MATMULS) for name, ops in counts.items()}
    assert matmuls["none"] == 7 and matmuls["qkv-gate-up"] == 4 and matmuls["all"] == 4, matmuls
    assert sum(counts["rmsnorm"].values()) <= sum(counts["none"].values())
    layer = target.model.get_decoder().layers[0]
    assert type(layer.input_layernorm).__name__ == "_FusedRMSNorm"  # the last engine built ran all fusions
    set_fusion(target.model, Fusion())


def test_fusions_undo_and_redo_on_the_same_weights(target):
    """Off again, the model has its own modules back (plain Linear, the RMSNorm class), the same outputs; on again,
    the same concatenated weights (CUDA graphs captured earlier still read them)."""
    attn = target.model.get_decoder().layers[0].self_attn
    norm_type = type(target.model.get_decoder().norm)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        plain = target.model(ids).logits
        set_fusion(target.model, Fusion(qkv=True, gate_up=True, norm=True))
        weight = attn.fused_projections.weight.data_ptr()
        fused = target.model(ids).logits
        assert set_fusion(target.model, Fusion()) == Fusion()
        assert type(attn.q_proj) is nn.Linear and type(target.model.get_decoder().norm) is norm_type
        again = target.model(ids).logits
        set_fusion(target.model, Fusion(qkv=True, gate_up=True, norm=True))
        assert attn.fused_projections.weight.data_ptr() == weight
        set_fusion(target.model, Fusion())
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    assert torch.equal(again, plain)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "phi3", "mistral"])
def test_fusions_across_the_architecture_matrix(arch, tmp_path):
    """Each family the batched engine takes, all switches on: what applies (Phi-3 has its QKV and gate-up merged
    already), and greedy tokens identical to the unfused engine's."""
    import transformers

    from edgespec.server.architectures import adapt_for_tree_verification
    from edgespec.shared.models.tiny import tiny_tokenizer

    names = {"llama": "Llama", "qwen3": "Qwen3", "phi3": "Phi3", "mistral": "Mistral"}
    cfg = getattr(transformers, f"{names[arch]}Config")(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.25, pad_token_id=256,
        bos_token_id=256, eos_token_id=258)
    torch.manual_seed(0)
    getattr(transformers, f"{names[arch]}ForCausalLM")(cfg).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu", dtype="float32")
    adapt_for_tree_verification(loaded.model, 256)
    target = TargetModel(loaded)
    want_tokens, want_hidden = verify_run(engine(target))
    eng = engine(target, Fusion(qkv=True, gate_up=True, norm=True), True)
    expected = Fusion(qkv=arch != "phi3", gate_up=arch != "phi3", norm=True)
    assert eng.fusion == expected, eng.describe()
    got_tokens, got_hidden = verify_run(eng)
    assert got_tokens == want_tokens
    torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-5, atol=1e-5)
