"""The server's verification cost by tree size, measured once at start and reported in Info.

A client sizes each tree from what a verification of that size costs here (client/README.md,
"The pipeline and the planner"): on a GPU a tree of 64 nodes costs about
what one token does, on a CPU it costs several times more. So the server opens
one throwaway session on a short context and verifies chain trees of a few sizes
through the same path a client's Draft takes (``VerifierCore.verify``: scheduler,
forward, acceptance, KV bookkeeping), keeping the fastest of a few tries per size
(other work on the machine only ever adds time, so the fastest is the truest).
Size 0 is a plain decode step (an empty tree). Clients refine the curve with the
timings each Verified carries, so a rough measurement at start is enough.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Sequence

from edgespec.shared.session_settings import SessionSettings
from edgespec.shared.tree import DraftTree, encode_tree

log = logging.getLogger("edgespec.server")

DEFAULT_SIZES = (0, 4, 16, 32)  # tree sizes measured: a decode step, a chain, the default trees, a wide one
# (clients extrapolate past the last with its slope); on a CPU a 1.5B target verifies them in a few seconds


@dataclass(frozen=True)
class CostCurve:
    """What Info reports: verification time by tree size, on a session of ``context`` tokens."""

    nodes: tuple[int, ...] = ()  # tree sizes, ascending (0: a plain decode step)
    total_ns: tuple[int, ...] = ()  # server time of a Draft of that size (the fastest try)
    context: int = 0  # committed tokens of the session it was measured on


def measure_cost_curve(core, sizes: Sequence[int] = DEFAULT_SIZES, context: int = 64,
                       repeats: int = 2, budget_s: float = 15.0) -> CostCurve:
    """The fastest ``Timings.total_ns`` of verifying a chain of each size (capped at the server's tree limit)
    on a fresh session of ``context`` tokens; the session is closed again. A plain step first warms the model
    up (not counted); a round that ends past ``budget_s`` is the last (a slow or busy machine starts on one
    try a size). A model that fails it starts all the same, with no curve (clients then learn the
    costs from the timings of their Verified), and the log says why."""
    from .metrics import ServerMetrics

    # The measurement is not traffic: its session must reach neither the server's metrics (a phantom request
    # on every dashboard) nor the prefix cache (random ids). It runs before the server takes any call.
    metrics, prefix_cache = core.metrics, core.prefix_cache
    core.metrics, core.prefix_cache = ServerMetrics(core.target.name, core.limits.max_context_tokens), None
    try:
        return _measure(core, sizes, context, repeats, budget_s)
    except Exception as err:  # noqa: BLE001 - a curve is a hint for clients; it must not stop the server
        log.warning("could not measure the verification cost curve (clients will learn it as they go): %s", err)
        return CostCurve()
    finally:
        core.metrics, core.prefix_cache = metrics, prefix_cache


def _measure(core, sizes: Sequence[int], context: int, repeats: int, budget_s: float) -> CostCurve:
    sizes = sorted({min(int(n), core.limits.max_tree_nodes) for n in sizes if n >= 0})
    vocab = core.target.vocab_size
    prompt = [(7 * i + 3) % vocab for i in range(max(2, context))]
    session_id = f"cost-curve-{uuid.uuid4()}"
    # Opened with a one-node tree: the prefill then takes the tree path every Open with a draft takes
    opened = core.open(SessionSettings(session_id), prompt, encode_tree(DraftTree.chain([3])))
    times: dict[int, list[int]] = {n: [] for n in sizes}
    start = time.monotonic()
    try:
        committed = core.verify(session_id, 1, opened.committed_len, b"").committed_len  # warm-up
        step = 1
        for round_ in range(max(1, repeats)):
            for n in sizes:
                # A chain of tokens the target will mostly reject keeps the context about the same length.
                tree = DraftTree.chain([(11 * i + round_) % vocab for i in range(n)])
                step += 1
                result = core.verify(session_id, step, committed, encode_tree(tree))
                committed = result.committed_len
                times[n].append(result.timings.total_ns)
            if time.monotonic() - start > budget_s:
                break
    finally:
        core.close(session_id)
    curve = CostCurve(tuple(sizes), tuple(min(times[n]) for n in sizes), len(prompt))
    log.info("verification cost by tree size: %s", ", ".join(
        f"{n} nodes {ns / 1e6:.1f} ms" for n, ns in zip(curve.nodes, curve.total_ns)))
    return curve
