"""A prepared check of the batched engine's step on a GPU host, in a few minutes, as JSON.

    edgespec models random /tmp/rnd-1.5b --like qwen2.5-coder-1.5b-instruct --device cuda
    python -m edgespec.server.gpu_check --model /tmp/rnd-1.5b --out gpu_check.json

For each switch of the step (``SWITCHES``: the attention, SDPA over gathered keys against FlexAttention
over the pool in place, with or without CUDA graphs; then the decoder's fusions, ``engine.fusion``, and the
argmax on the head's own output, each alone and all together) it builds the engine, opens 1, 8 and 16 sessions at
--context tokens, and times the step alone (``StepTimes.device_ns``: CUDA events around the graph replay
or the eager step) for a decode step (one row a session) and a verification of a --tree-nodes tree a
session, median of --repeats, each session's KV held at the same length; then again at --long-context
tokens for up to 8 sessions (how the cost grows with the keys). Then, for 8 sessions' decode
step run eagerly under the profiler: the number of device kernels, the attention kernels' names, and the
ATen ops one decoder layer dispatches (with --inductor, also the kernels Inductor generates for the
verification step compiled), and for the pool attention how far a verification's argmax rows and hidden
states agree with SDPA's from the same KV. Last, it builds the engine as a default server does (the whole grid
captured at a 32,768-token context) and times that start. Each switch's failure is recorded with its error and the run goes
on; switches past --budget-s are skipped. Random weights in the real shapes time what the real weights
would (acceptance aside: a verification's cost does not depend on what it accepts).

On a CPU (or with a tiny model) it runs the same way without graphs: the tests run it so, and its ATen
op counts per layer compare the attentions there.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch._dynamo

from .engine.fusion import Fusion

@dataclass(frozen=True)
class Switch:
    """One way of running the step that the check measures."""

    attention: str  # "sdpa" or "flex" (``PoolConfig.attention``)
    graphs: bool  # CUDA graphs per bucket (on a GPU)
    block_size: int = 0  # KV block size; 0: the engine's default for that attention
    fusion: Fusion = Fusion()  # merged projections, fused norms (``engine.fusion``)
    bf16_argmax: bool = False  # the argmax of the head's own output, not of its float32 copy


ALL_FUSED = Fusion(qkv=True, gate_up=True, norm=True)
SWITCHES = {
    "sdpa-graphs": Switch("sdpa", True),  # before: keys gathered per session, a dense mask, graphs per bucket
    "flex-graphs": Switch("flex", True),  # after: the pool read in place through a block mask, graphs per bucket
    "flex-graphs-block128": Switch("flex", True, 128),  # the same with FlexAttention's default tile as the block
    "flex-eager": Switch("flex", False),  # without graphs (launch overhead shows)
    # each fusion alone on flex-graphs, then all of them: before (flex-graphs) and after
    "flex-graphs-qkv-gate-up": Switch("flex", True, fusion=Fusion(qkv=True, gate_up=True)),
    "flex-graphs-rmsnorm": Switch("flex", True, fusion=Fusion(norm=True)),
    "flex-graphs-bf16-argmax": Switch("flex", True, bf16_argmax=True),
    "flex-graphs-fused": Switch("flex", True, fusion=ALL_FUSED, bf16_argmax=True),
}


@dataclass
class SwitchResult:
    attention: str
    graphs: bool
    block_size: int = 0
    fused: list[str] = field(default_factory=list)  # the fusions the engine runs with (what applied)
    start_s: float = 0.0  # engine build (and graph capture)
    decode_ms: dict[int, float] = field(default_factory=dict)  # sessions -> median step alone
    tree_ms: dict[int, float] = field(default_factory=dict)
    long_decode_ms: dict[int, float] = field(default_factory=dict)  # the same at --long-context tokens
    long_tree_ms: dict[int, float] = field(default_factory=dict)
    kernels: int | None = None  # device kernels of one eager decode step (8 sessions); None on a CPU
    attention_kernels: list[str] = field(default_factory=list)
    aten_ops_per_layer: int = 0  # ATen ops decoder layer 0 dispatches in that step
    aten_ops_step: int = 0
    layer_ops: dict[str, int] = field(default_factory=dict)  # those ops by name
    inductor_kernels: int | None = None  # kernels Inductor generates for the verification step compiled (--inductor)
    inductor_error: str | None = None
    agreement: float | None = None  # pool attention: share of a verification's argmax rows equal to SDPA's (random
    # weights give nearly flat logits, so in bf16 a rounding apart can flip a row: read it beside the next one)
    max_hidden_diff: float | None = None  # and the largest difference of their final hidden states
    fused_agreement: float | None = None  # with fusions: the same two figures against the unfused step
    fused_max_hidden_diff: float | None = None
    describe: str = ""
    error: str | None = None


def random_tree(rng: random.Random, nodes: int, vocab: int):
    from edgespec.shared.tree import ROOT, DraftTree

    parents = tuple(rng.choice([ROOT] + list(range(max(0, i - 3), i))) for i in range(nodes))  # depth grows
    return DraftTree(tuple(rng.randrange(vocab) for _ in range(nodes)), parents)


def build(target, switch: Switch, sessions: list[int], contexts: list[int], tree_nodes: int, kv_bytes: int):
    """The engine for one switch; with graphs (CUDA only), captured for the measured buckets alone, so start-up
    stays short (the server captures a whole grid)."""
    from .engine.base import Work
    from .engine.batched import BatchedEngine, PoolConfig, _pow2
    from .engine.graphs import GraphRunner

    cuda = target.device.type == "cuda"
    config = PoolConfig(max_kv_bytes=kv_bytes, max_seqs=max(sessions), max_context_tokens=max(contexts) + 64,
                        max_tree_nodes=tree_nodes, shape_buckets=cuda, graphs=False, attention=switch.attention,
                        block_size=switch.block_size, max_batch=_pow2(max(sessions)),
                        first_key_bucket=_pow2(min(contexts) + tree_nodes + 1), fusion=switch.fusion,
                        bf16_argmax=switch.bf16_argmax)
    engine = BatchedEngine(target, config)
    if switch.graphs and cuda:  # the buckets the measured steps fall in, as the engine picks them
        buckets = {engine.bucket([Work.chunk([1] * rows, 0)] * n, context + rows)[0]
                   for n in sessions for rows in (1, tree_nodes + 1) for context in contexts}
        engine.runner = GraphRunner(engine.step, buckets)
    return engine


def held_sessions(engine, n: int, context: int, vocab: int, rng: random.Random):
    from .engine.base import Work

    kvs = [engine.new_kv() for _ in range(n)]
    for kv in kvs:  # prefill one session at a time: a long chunk runs eagerly at its own shape
        engine.run([(kv, Work.chunk([rng.randrange(vocab) for _ in range(context)], 0, logits=False))])
    return kvs


def step_ms(engine, kvs, works_of, repeats: int) -> float:
    """Median of the step alone over `repeats` steps; each step's rows are dropped again (context held)."""
    times = []
    for _ in range(repeats + 2):
        lengths = [len(kv) for kv in kvs]
        before = engine.times.copy()
        engine.run(list(zip(kvs, works_of(kvs))))
        times.append(engine.times.minus(before).device_ns / 1e6)
        for kv, n in zip(kvs, lengths):
            kv.crop(n)
    return statistics.median(times[2:])  # the first two: warm-up (lazy inits, a first compile)


def profile_step(engine, kvs, works) -> tuple[int | None, list[str], int, int, dict[str, int]]:
    """(device kernels, attention kernel names, ATen ops of decoder layer 0, ATen ops of the step, layer 0's ops by
    name) for one eager step (the graphs bypassed, so the profiler sees every kernel)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode

    from .engine.graphs import EagerRunner

    from torch.utils._python_dispatch import _disable_current_modes

    class Ops(TorchDispatchMode):
        supports_higher_order_operators = True  # FlexAttention is one: counted as one op, run as it is

        def __init__(self):
            super().__init__()
            self.step = self.layer = 0
            self.in_layer = False
            self.names: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.step += 1
            self.layer += self.in_layer
            if self.in_layer:
                self.names[str(func)] += 1
            if isinstance(func, torch._ops.HigherOrderOperator):
                with _disable_current_modes():
                    return func(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    from .engine import attention

    layer = engine.target.model.get_decoder().layers[0]
    runner, engine.runner = engine.runner, EagerRunner(engine.step)
    counter = Ops()
    eager_flex = attention._quiet_flex

    def counted_flex(*args, **kwargs):  # eager FlexAttention compiles its own call, which no dispatch mode may
        # watch: one op, run with the counter set aside
        counter.step += 1
        counter.layer += counter.in_layer
        if counter.in_layer:
            counter.names["flex_attention"] += 1
        with _disable_current_modes():
            return eager_flex(*args, **kwargs)

    hooks = [layer.register_forward_pre_hook(lambda *a: setattr(counter, "in_layer", True)),
             layer.register_forward_hook(lambda *a: setattr(counter, "in_layer", False))]
    lengths = [len(kv) for kv in kvs]
    try:
        engine.run(list(zip(kvs, works)))  # warm (a first compile of a new shape is not the step)
        for kv, n in zip(kvs, lengths):
            kv.crop(n)
        attention._quiet_flex = counted_flex
        try:
            with counter:
                engine.run(list(zip(kvs, works)))
        finally:
            attention._quiet_flex = eager_flex
        for kv, n in zip(kvs, lengths):
            kv.crop(n)
        cuda = engine.target.device.type == "cuda"
        kernels, names = None, []
        if cuda:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                engine.run(list(zip(kvs, works)))
                torch.cuda.synchronize()
            for kv, n in zip(kvs, lengths):
                kv.crop(n)
            device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                             and not e.name.startswith(("Memcpy", "Memset"))]
            kernels = len(device_events)
            names = sorted({e.name[:120] for e in device_events
                            if any(k in e.name.lower() for k in ("flex", "attention", "fmha", "flash", "sdpa"))})
        return kernels, names, counter.layer, counter.step, dict(counter.names)
    finally:
        engine.runner = runner
        for h in hooks:
            h.remove()


def server_start(target, context: int) -> dict:
    """The engine as a default server builds it (``app``: --gpu-memory-utilization 0.9, 64 sessions, the whole grid
    captured at `context` tokens): seconds to build, and what it says of itself."""
    from edgespec.shared.wire import MAX_NODES

    from .engine.batched import API_SEQS, BatchedEngine, PoolConfig
    from .engine.memory import kv_pool_bytes

    cuda = target.device.type == "cuda"
    started = time.perf_counter()
    try:
        pool = PoolConfig(kv_pool_bytes(target, 0.9, 8 << 30, PoolConfig.max_batch_rows), 64 + API_SEQS, context,
                          MAX_NODES, shape_buckets=cuda, graphs=cuda)
        engine = BatchedEngine(target, pool)
        out = {"context": context, "start_s": round(time.perf_counter() - started, 1), "describe": engine.describe(),
               "error": None}
        del engine
    except Exception as exc:  # noqa: BLE001 - recorded
        out = {"context": context, "start_s": round(time.perf_counter() - started, 1), "describe": "",
               "error": f"{type(exc).__name__}: {str(exc)[:600]}"}
    if cuda:
        torch.cuda.empty_cache()
    return out


def inductor_kernels(target, switch: Switch, context: int, sessions: int, tree_nodes: int) -> int:
    """Kernels Inductor generates for one compiled verification step of `sessions` sessions (its own engine: the
    graph compiled once for that bucket). A verification, not a decode step: on a CPU, Inductor's FlexAttention
    kernel takes no query of under four rows with grouped KV heads."""
    import torch._inductor.metrics as metrics

    from .engine.base import Work
    from .engine.batched import BatchedEngine, PoolConfig

    torch._dynamo.reset()
    engine = BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=sessions, max_context_tokens=context + 64,
                                              max_tree_nodes=16, attention=switch.attention,
                                              block_size=switch.block_size, shape_buckets=True,
                                              compile_backend="inductor", fusion=switch.fusion,
                                              bf16_argmax=switch.bf16_argmax))
    kvs = held_sessions(engine, sessions, context, min(1000, target.vocab_size), random.Random(0))
    metrics.reset()
    rng = random.Random(1)
    engine.run([(kv, Work.tree(1, random_tree(rng, tree_nodes, 100), len(kv), accept=True)) for kv in kvs])
    count = metrics.generated_kernel_count
    for kv in kvs:
        kv.close()
    return count


def agreement(engine, kvs, works) -> tuple[float, float]:
    """The same step run eagerly with the engine's attention and with SDPA over gathered keys, from the same KV:
    (share of logits rows whose argmax agrees, largest hidden-state difference). The model's attention takes
    SDPA's path whenever the step passes a dense mask, so switching the step's attention is enough."""
    from .engine.graphs import EagerRunner

    runner, engine.runner = engine.runner, EagerRunner(engine.step)
    own = engine.step.attention
    lengths = [len(kv) for kv in kvs]
    outs = {}
    try:
        for attention in (own, "sdpa"):
            engine.step.attention = attention
            got = engine.run(list(zip(kvs, works)))
            outs[attention] = ([o.best for o in got], torch.cat([o.hidden.float() for o in got]))
            for kv, n in zip(kvs, lengths):
                kv.crop(n)
    finally:
        engine.step.attention, engine.runner = own, runner
    (best_a, hidden_a), (best_b, hidden_b) = outs.values()
    rows = [x == y for a, b in zip(best_a, best_b) for x, y in zip(a, b)]
    return sum(rows) / max(1, len(rows)), float((hidden_a - hidden_b).abs().max())


def fused_agreement(engine, kvs, works) -> tuple[float, float]:
    """The same step run eagerly with the engine's fusions and without any, from the same KV: (share of logits
    rows whose argmax agrees, largest hidden-state difference)."""
    from .engine.fusion import Fusion, set_fusion
    from .engine.graphs import EagerRunner

    runner, engine.runner = engine.runner, EagerRunner(engine.step)
    own, own_argmax = engine.config.fusion, engine.step.bf16_argmax
    lengths = [len(kv) for kv in kvs]
    outs = []
    try:
        for fusion, bf16_argmax in ((own, own_argmax), (Fusion(), False)):
            set_fusion(engine.target.model, fusion)
            engine.step.bf16_argmax = bf16_argmax
            got = engine.run(list(zip(kvs, works)))
            outs.append(([o.best for o in got], torch.cat([o.hidden.float() for o in got])))
            for kv, n in zip(kvs, lengths):
                kv.crop(n)
    finally:
        set_fusion(engine.target.model, own)
        engine.step.bf16_argmax, engine.runner = own_argmax, runner
    (best_a, hidden_a), (best_b, hidden_b) = outs
    rows = [x == y for a, b in zip(best_a, best_b) for x, y in zip(a, b)]
    return sum(rows) / max(1, len(rows)), float((hidden_a - hidden_b).abs().max())


def check(model: str, sessions: list[int], context: int, tree_nodes: int, repeats: int, budget_s: float,
          switches: list[str], kv_bytes: int, device: str | None = None, dtype: str | None = None,
          long_context: int = 0, start_context: int = 0, inductor: bool = False) -> dict:
    from edgespec.shared.models.loading import load_model

    from .engine.base import Work
    from .target import TargetModel

    t0 = time.perf_counter()
    target = TargetModel(load_model(model, device=device, dtype=dtype))
    vocab = min(1000, target.vocab_size)
    out: dict = {"model": target.name, "device": str(target.device), "dtype": str(target.dtype).removeprefix("torch."),
                 "gpu": torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else None,
                 "torch": torch.__version__, "context": context, "long_context": long_context,
                 "tree_nodes": tree_nodes, "repeats": repeats, "sessions": sessions, "switches": {}}
    contexts = [context] + ([long_context] if long_context else [])
    long_sessions = [n for n in sessions if n <= 8]  # a long context for up to 8 sessions: the pool's memory
    for name in switches:
        switch = SWITCHES[name]
        attention = switch.attention
        result = SwitchResult(attention, switch.graphs and target.device.type == "cuda", switch.block_size)
        out["switches"][name] = result
        if time.perf_counter() - t0 > budget_s:
            result.error = f"skipped: past the {budget_s:.0f} s budget"
            continue
        try:
            torch._dynamo.reset()  # a switch starts from no compiled frames (nor frames another marked skipped)
            started = time.perf_counter()
            engine = build(target, switch, sessions, contexts, tree_nodes, kv_bytes)
            result.start_s = time.perf_counter() - started
            result.block_size = engine.config.block_size
            result.fused = [k for k, on in vars(engine.fusion).items() if on] + (["bf16_argmax"] * switch.bf16_argmax)
            result.describe = engine.describe()
            rng = random.Random(0)
            for n in sessions:
                kvs = held_sessions(engine, n, context, vocab, rng)
                result.decode_ms[n] = step_ms(engine, kvs, lambda ks: [Work.chunk([1], len(kv)) for kv in ks], repeats)
                result.tree_ms[n] = step_ms(engine, kvs, lambda ks: [
                    Work.tree(1, random_tree(rng, tree_nodes, vocab), len(kv), accept=True) for kv in ks], repeats)
                if n == sorted(sessions)[len(sessions) // 2]:
                    trees = [Work.tree(1, random_tree(rng, tree_nodes, vocab), len(kv)) for kv in kvs]
                    if attention == "flex":
                        result.agreement, result.max_hidden_diff = agreement(engine, kvs, trees)
                    if result.fused:
                        result.fused_agreement, result.fused_max_hidden_diff = fused_agreement(engine, kvs, trees)
                    decode = [Work.chunk([1], len(kv)) for kv in kvs]
                    (result.kernels, result.attention_kernels, result.aten_ops_per_layer, result.aten_ops_step,
                     result.layer_ops) = profile_step(engine, kvs, decode)
                for kv in kvs:
                    kv.close()
            for n in long_sessions if long_context else []:
                kvs = held_sessions(engine, n, long_context, vocab, rng)
                result.long_decode_ms[n] = step_ms(engine, kvs, lambda ks: [Work.chunk([1], len(kv)) for kv in ks],
                                                   repeats)
                result.long_tree_ms[n] = step_ms(engine, kvs, lambda ks: [
                    Work.tree(1, random_tree(rng, tree_nodes, vocab), len(kv), accept=True) for kv in ks], repeats)
                for kv in kvs:
                    kv.close()
            del engine
            if inductor:
                try:
                    result.inductor_kernels = inductor_kernels(target, switch, context,
                                                               sorted(sessions)[len(sessions) // 2], tree_nodes)
                except Exception as exc:  # noqa: BLE001 - recorded beside the switch's other figures
                    result.inductor_error = f"{type(exc).__name__}: {str(exc)[:300]}"
        except Exception as exc:  # noqa: BLE001 - one switch failing is a result; the others still run
            result.error = f"{type(exc).__name__}: {str(exc)[:600]}"
        finally:
            if target.device.type == "cuda":
                torch.cuda.empty_cache()
    if start_context:  # last: it captures a whole grid, the longest part of a run
        left = budget_s - (time.perf_counter() - t0)
        out["server_start"] = server_start(target, start_context) if left > 120 else {
            "context": start_context, "error": f"skipped: {left:.0f} s of the budget left"}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["switches"] = {k: vars(v) for k, v in out["switches"].items()}
    return out


def table(result: dict) -> str:
    """The JSON's figures as a markdown table (for a README)."""
    long = result.get("long_context") or 0
    lines = [f"| switch | sessions | decode ms | tree ms | tree at {long} / at {result['context']} | kernels | "
             f"ATen ops / layer | attention kernel |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in result["switches"].items():
        if r["error"]:
            lines.append(f"| {name} | – | – | – | – | – | – | {r['error'][:80]} |")
            continue
        for n in result["sessions"]:
            ratio = f"{r['long_tree_ms'][n] / r['tree_ms'][n]:.2f}" if n in r["long_tree_ms"] else "–"
            lines.append(f"| {name} | {n} | {r['decode_ms'][n]:.2f} | {r['tree_ms'][n]:.2f} | {ratio} | "
                         f"{r['kernels']} | {r['aten_ops_per_layer']} | {', '.join(r['attention_kernels'])[:60]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgespec.server.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder (edgespec models random ...) or registry name")
    p.add_argument("--sessions", nargs="+", type=int, default=[1, 8, 16])
    p.add_argument("--context", type=int, default=512, help="tokens every session holds")
    p.add_argument("--long-context", type=int, default=4096, help="the same measured again at this context, for up "
                                                                  "to 8 sessions (0: not)")
    p.add_argument("--tree-nodes", type=int, default=16)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--inductor", action="store_true",
                   help="also count the kernels Inductor generates for each switch's verification step (a compile each)")
    p.add_argument("--server-start", type=int, default=32768, metavar="CONTEXT",
                   help="last, build the engine as a default server does at this context and time it (0: not)")
    p.add_argument("--budget-s", type=float, default=420.0, help="switches that would start past this are skipped")
    p.add_argument("--switches", nargs="+", default=list(SWITCHES), choices=list(SWITCHES))
    p.add_argument("--kv-gb", type=float, default=8.0, help="the KV pool's memory")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    result = check(args.model, args.sessions, args.context, args.tree_nodes, args.repeats, args.budget_s,
                   args.switches, int(args.kv_gb * 2**30), args.device, args.dtype, args.long_context,
                   args.server_start, args.inductor)
    text = json.dumps(result, indent=1)
    print(text)
    print(table(result), file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
