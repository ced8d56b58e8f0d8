"""Drafters with CORAL's LM-head router in the real system: a tiny target behind a real gRPC
server, EAGLE and MoA drafters trained a little by the real trainer (stage 1), a router trained
on each with the base frozen (stage 2), drafting through the client with the router attached:
greedy output token-exact with the target's. And the router benchmark's command at tiny scale."""
from __future__ import annotations

import pytest
from support.servers import running_server

pytestmark = pytest.mark.slow  # module fixtures train two drafters and their routers; end to end

PROMPT = "Write a function that adds two numbers."
ROUTER_OPTS = {"n_groups": "8", "top_g": "3", "router_hidden": "32"}


@pytest.fixture(scope="module")
def checkpoints(train_drafter):
    """kind -> checkpoint (eagle file / MoA folder) with router.safetensors beside it: the base drafter
    trained 100 steps, then its router 60 steps with the base frozen."""
    return {kind: train_drafter(f"{kind}+router", steps=60, options=ROUTER_OPTS,
                                init=train_drafter(kind, steps=100))
            for kind in ("eagle", "moa")}


@pytest.fixture(scope="module")
def server(target_dir, checkpoints):
    with running_server(target_dir, http_port=None, moa_server_parts={"moa-tli0": str(checkpoints["moa"])}) as handle:
        yield handle


@pytest.mark.parametrize("kind", ["eagle", "moa"])
def test_drafting_with_the_router_is_token_exact(target_greedy, kind, server, target, target_dir, checkpoints):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig
    from edgespec.client.loop.generation import GenerationConfig
    from edgespec.netem.bench.router import open_routed_drafter

    drafter, routed, _, _ = open_routed_drafter(str(checkpoints[kind]), str(target_dir), TreeShape())
    drafter.rt.attach_router(routed)
    link = LinkConfig(server.address, min_deadline_s=5.0)
    client = EdgespecClient(ClientConfig(link, DrafterOptions(kind)), tokenizer=target.tokenizer, drafter=drafter)
    try:
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert drafter.rt.routed is routed  # the router drafted every tree
        assert result.token_ids == target_greedy(target.model, ids, 48)
        assert result.metrics.num_accepted_tokens > 0, "a trained drafter with its router should get drafts accepted"
    finally:
        client.close()


def test_router_benchmark_prints_both_modes(checkpoints, target_dir, tmp_path, capsys):
    import json

    from edgespec.netem.bench.router import MODES
    from edgespec.cli import build_parser

    out = tmp_path / "bench.json"
    args = build_parser().parse_args(["bench", "router", "--checkpoint", str(checkpoints["eagle"]), "--target",
                                      str(target_dir), "--dtype", "float32", "--humaneval", "0", "--mtbench", "0",
                                      "--prompt", PROMPT, "--prompt", "Reverse a string in Python.", "--max-tokens",
                                      "24", "--head-repeat", "5", "--out", str(out)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "| drafting ms per tree |" in printed and "| accepted at depth 1 per tree |" in printed
    report = json.loads(out.read_text())
    assert report["same_output"] == "2/2"  # verification is lossless with or without the router
    for mode in MODES:
        s = report["summary"][mode]
        assert s["trees"] > 0 and s["draft_ms_per_tree"] > 0 and s["tau"] >= 1.0
