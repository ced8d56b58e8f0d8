"""`edgespec bench server` at tiny scale: both engines, every table."""
from __future__ import annotations

import pytest


@pytest.mark.slow
def test_server_benchmark_prints_both_engines(tiny_model_dir, capsys):
    from edgespec.cli import build_parser

    args = build_parser().parse_args(["bench", "server", "--models", str(tiny_model_dir), "--tree-sizes", "1", "4",
                                      "--sessions", "1", "2", "--seconds", "0.3", "--warmup", "0.2", "--repeats", "2",
                                      "--dtype", "float32", "--device", "cpu",
                                      "--engines", "generic", "batched", "bucketed"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "verify latency, one session" in out and "throughput" in out and "device-ms per committed token" in out
    for engine in ("generic", "batched", "bucketed"):
        assert f"| {engine} | 2 |" in out
