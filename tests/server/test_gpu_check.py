"""The prepared GPU check runs on a CPU with the tiny target: every switch measured (no graphs there), and its
ATen op counts per decoder layer printed, before (SDPA over gathered keys) and after (FlexAttention over the pool).
Counts and times are printed, never asserted as speed; what is asserted is what the layer does: the pool
attention's layer gathers no keys, repeats no KV heads and builds no dense mask."""
from __future__ import annotations

import pytest

from edgespec.server.gpu_check import SWITCHES, check, table


def test_the_gpu_check_runs_on_a_cpu_and_counts_each_layers_ops(tiny_model_dir):
    result = check(str(tiny_model_dir), sessions=[1, 2], context=24, tree_nodes=5, repeats=2, budget_s=600,
                   switches=list(SWITCHES), kv_bytes=16 << 20, device="cpu", dtype="float32", long_context=100,
                   start_context=256)
    print()
    print(table(result))
    for name, r in result["switches"].items():
        print(name, r["aten_ops_per_layer"], "ATen ops a layer:", r["layer_ops"])
        assert r["error"] is None, (name, r["error"])
        assert set(r["decode_ms"]) == set(r["tree_ms"]) == set(r["long_tree_ms"]) == {1, 2}
        assert r["aten_ops_per_layer"] > 0
        assert not r["graphs"] and r["kernels"] is None  # no CUDA here
    for name in ("flex-graphs", "flex-eager"):  # float32: the pool attention's tokens are SDPA's
        assert result["switches"][name]["agreement"] == 1.0 and result["switches"][name]["max_hidden_diff"] < 1e-4
    for name, r in result["switches"].items():  # and a fused step's are the unfused step's
        assert bool(r["fused"]) == (name.startswith("flex-graphs-") and name != "flex-graphs-block128"), name
        if r["fused"]:
            assert r["fused_agreement"] == 1.0 and r["fused_max_hidden_diff"] < 1e-4, (name, r)
    fused, plain = result["switches"]["flex-graphs-qkv-gate-up"]["layer_ops"], result["switches"]["flex-graphs"]["layer_ops"]
    assert sum(fused.values()) < sum(plain.values())  # two matmuls and their views fewer
    assert result["server_start"]["error"] is None and "batched" in result["server_start"]["describe"]
    sdpa, flex = result["switches"]["sdpa-graphs"]["layer_ops"], result["switches"]["flex-eager"]["layer_ops"]
    assert sdpa.get("aten.scaled_dot_product_attention.default") or any("attention" in k for k in sdpa), sdpa
    assert flex.get("flex_attention") == 1
    assert not any("scaled_dot_product" in k or k.startswith("aten.index.") for k in flex), flex  # no gather
    assert any(k.startswith("aten.index.") for k in sdpa)  # the gather the pool attention removes
    assert not any("repeat" in k or "expand" in k for k in flex), flex  # no repeat_kv


@pytest.mark.slow
def test_the_gpu_check_counts_inductors_kernels_for_each_attention(tiny_model_dir):
    """--inductor: the verification step compiled by Inductor on the CPU, its generated kernels counted (printed)."""
    result = check(str(tiny_model_dir), sessions=[2], context=24, tree_nodes=5, repeats=1, budget_s=600,
                   switches=["sdpa-graphs", "flex-eager", "flex-graphs-qkv-gate-up", "flex-graphs-rmsnorm",
                             "flex-graphs-fused"], kv_bytes=16 << 20, device="cpu", dtype="float32", inductor=True)
    for name, r in result["switches"].items():
        print(name, "Inductor kernels for a verification step:", r["inductor_kernels"])
        assert r["error"] is None and r["inductor_error"] is None and r["inductor_kernels"] > 0, (name, r)
