"""How the batched engine's pool is sized and which block size and attention auto picks, per device; and
--gpu-memory-utilization on the command line (vLLM's name and meaning)."""
from __future__ import annotations

import pytest

from edgespec.server.engine.batched import BLOCK_SIZE, FLEX_BLOCK_SIZE, BatchedEngine, PoolConfig
from edgespec.server.engine.memory import kv_pool_bytes, step_workspace_bytes


def test_auto_picks_the_attention_and_its_block_size_by_device():
    auto = PoolConfig()
    assert auto.resolved("cuda").attention == "flex" and auto.resolved("cuda").block_size == FLEX_BLOCK_SIZE
    assert auto.resolved("cpu").attention == "sdpa" and auto.resolved("cpu").block_size == BLOCK_SIZE
    assert PoolConfig(attention="flex", block_size=128).resolved("cpu").block_size == 128  # asked for: kept
    assert PoolConfig(attention="sdpa").resolved("cuda").block_size == BLOCK_SIZE


def test_off_a_gpu_the_pool_is_max_kv_bytes_and_never_more_than_sessions_can_use(tiny_target):
    assert kv_pool_bytes(tiny_target, 0.9, 123 << 20, 2048) == 123 << 20
    assert step_workspace_bytes(tiny_target, 2048) > step_workspace_bytes(tiny_target, 64) > 0
    config = PoolConfig(max_kv_bytes=1 << 40, max_seqs=3, max_context_tokens=100, max_tree_nodes=11)
    blocks, block_bytes = BatchedEngine.blocks_that_fit(tiny_target, config)
    assert blocks == 3 * (112 // 16)  # three sessions of 100 + 12 positions, no more for a budget of 1 TiB
    small = PoolConfig(max_kv_bytes=5 * block_bytes, max_seqs=3, max_context_tokens=100, max_tree_nodes=11)
    assert BatchedEngine.blocks_that_fit(tiny_target, small)[0] == 4  # what the budget holds, less scratch
    with pytest.raises(ValueError, match="fewer than one session"):
        BatchedEngine(tiny_target, small)  # 4 blocks of 16 cannot hold one session's 112 positions


def test_gpu_memory_utilization_on_the_command_line():
    from edgespec.cli import build_parser
    from edgespec.server.cli import server_config

    args = build_parser().parse_args(["server", "m", "--gpu-memory-utilization", "0.5"])
    assert server_config(args).gpu_memory_utilization == 0.5
    assert server_config(build_parser().parse_args(["server", "m"])).gpu_memory_utilization == 0.9  # vLLM's
    with pytest.raises(SystemExit, match="gpu-memory-utilization"):
        server_config(build_parser().parse_args(["server", "m", "--gpu-memory-utilization", "1.5"]))
