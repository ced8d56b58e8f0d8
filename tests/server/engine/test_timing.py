"""The engines' step times: every step counted once, its parts apart, and the forward alone within the step's
host time on a CPU (where the step runs in the calling thread)."""
from __future__ import annotations

import pytest

from edgespec.server.engine.base import Work
from edgespec.server.engine.batched import BatchedEngine, PoolConfig
from edgespec.server.engine.generic import GenericEngine
from edgespec.server.engine.timing import StepTimes


@pytest.mark.parametrize("kind", ["generic", "batched"])
def test_each_step_is_counted_with_its_parts(tiny_target, kind):
    engine = (GenericEngine(tiny_target) if kind == "generic" else
              BatchedEngine(tiny_target, PoolConfig(max_kv_bytes=1 << 30, max_seqs=4, max_context_tokens=256)))
    kvs = [engine.new_kv() for _ in range(3)]
    before = engine.times.copy()
    engine.run([(kv, Work.chunk(list(range(5 + i, 12 + i)), 0)) for i, kv in enumerate(kvs)])
    engine.run([(kv, Work.chunk([7], len(kv))) for kv in kvs])
    spent = engine.times.minus(before)
    steps = 2 if kind == "batched" else 6  # the generic engine runs one forward per item
    assert spent.steps == steps
    assert spent.device_ns > 0 and spent.pack_ns > 0 and spent.launch_ns > 0
    assert spent.device_ns <= spent.launch_ns  # a CPU's forward is inside the step call, timed around it
    means = spent.per_step_ms()
    assert means["steps"] == steps and set(means) == {"steps", "pack", "launch", "device", "readback", "items"}
    assert StepTimes().per_step_ms() == {}
    for kv in kvs:
        kv.close()
