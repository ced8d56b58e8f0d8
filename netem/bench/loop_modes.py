"""The loops a benchmark can compare in one run, each a ``LoopConfig`` named after the drafter it drives
("independent@serial"): the client's default loop and the loops it replaced, one switch off at a time, so a
run shows what each change of the loop bought. The client itself runs only the configuration it is given."""
from __future__ import annotations

from edgespec.client import LoopConfig

LOOP_MODES = {
    "serial": LoopConfig(pipeline=False, tree="fixed"),  # the first loop: draft, send, wait, commit
    "pipelined": LoopConfig(tree="fixed"),  # drafting ahead, the drafter's own shape every step
    "auto-serial": LoopConfig(pipeline=False),  # trees sized each step, no drafting ahead
    "auto": LoopConfig(),  # the default: both
    "auto-1": LoopConfig(decode_ahead=1, queue_plain=False),  # before plain steps decoded ahead: a round trip
    # a token
    "auto-unqueued": LoopConfig(queue_plain=False),  # before plain steps were queued: a round trip a plain step
    "auto-finish-missed": LoopConfig(stop_missed=False),  # before a tree drafted ahead stopped at a verdict that
    # ruled it out: it was drafted to its end, then the next one
    "auto-by-path": LoopConfig(depth_by_path=True),  # trees stopped by their own paths' probabilities and the
    # loop's costs (tree_size.path_floors), not capped at the planner's depth
    "auto-unsettled": LoopConfig(settle=False),  # before a switch between plain steps and trees was charged its
    # cost: the steady rates alone picked each step's kind
    "auto-no-overlap": LoopConfig(overlap_open=False),  # before Open overlapped the drafter's prefill: the tree
    # from the prompt went with Open
    "auto-no-copies": LoopConfig(copies=False),  # before an +ngram drafter's lookup replaced a plain step with its
    # copy where that paid (DraftPipeline._copy)
}


def loop_mode(system: str) -> tuple[str, LoopConfig]:
    """"independent@serial" -> ("independent", the serial loop); a name without "@" gets the default loop. The
    loop is the last "@" part; a drafter with a tree shape ("independent:2x6x8@0.1", netem/bench/systems.py)
    keeps its own "@"."""
    drafter, _, mode = system.rpartition("@")
    if mode in LOOP_MODES and drafter:
        return drafter, LOOP_MODES[mode]
    if "@" in system and ":" not in system:
        raise ValueError(f"unknown loop {mode!r} in {system!r}; choose one of {', '.join(LOOP_MODES)}")
    return system, LOOP_MODES["auto"]
