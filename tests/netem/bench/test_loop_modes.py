"""The loops a benchmark compares by name (``netem/bench/loop_modes.py``): "drafter@loop" picks one, a name
without a loop gets the client's default, and a drafter's own tree shape keeps its "@"."""
from __future__ import annotations

import pytest

from edgespec.client import LoopConfig
from edgespec.netem.bench.loop_modes import LOOP_MODES, loop_mode


def test_loops_by_name():
    assert loop_mode("independent") == ("independent", LoopConfig())
    assert loop_mode("ngram@serial") == ("ngram", LoopConfig(pipeline=False, tree="fixed"))
    assert set(LOOP_MODES) == {"serial", "pipelined", "auto-serial", "auto", "auto-1", "auto-unqueued",
                               "auto-finish-missed", "auto-by-path", "auto-no-overlap", "auto-unsettled",
                               "auto-no-copies"}
    assert loop_mode("independent@auto-finish-missed") == ("independent", LoopConfig(stop_missed=False))
    assert loop_mode("independent@auto-by-path") == ("independent", LoopConfig(depth_by_path=True))
    assert loop_mode("ngram@auto-1") == ("ngram", LoopConfig(decode_ahead=1, queue_plain=False))
    assert loop_mode("independent:2x6x8@0.1@pipelined") == ("independent:2x6x8@0.1", LoopConfig(tree="fixed"))
    assert loop_mode("independent:2x6x8@0.1") == ("independent:2x6x8@0.1", LoopConfig())
    with pytest.raises(ValueError, match="unknown loop 'fast'"):
        loop_mode("ngram@fast")
