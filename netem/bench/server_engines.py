"""Server benchmark: the engines side by side on one target, in one run.

    edgespec models random --like qwen2.5-coder-1.5b-instruct /tmp/rnd-1.5b      # no weights needed
    edgespec bench server --models /tmp/rnd-1.5b --engines generic batched bucketed

For each engine (``generic``: a DynamicCache per session, one forward each;
``batched``: the KV pool, one forward for every session's work, as the server
builds it on that device: exact shapes and eager on a CPU, shape buckets with a
CUDA graph per bucket on a GPU unless --enforce-eager; ``batched-eager``: the
same without graphs, so graphs and eager are timed in one run; ``bucketed``: the
pool with shape buckets forced on, graphs as for batched):

- latency: one session at --context tokens; a plain decode step (one token)
  and a verification per tree size (random trees, depth up to 6), median of
  --repeats, in ms and as a multiple of the decode step;
- throughput: N sessions (--sessions, 1/4/16/64) on threads, each verifying
  random --tree-nodes trees as fast as answers come, for --seconds; the
  figures are verifications per second and device-ms per verification (the
  model thread's busy time, from CUDA events on a GPU, over the verifications
  done). Then the plain API (the server decoding alone) with N
  generations at once: tokens per second and device-ms per token;
- device-ms per committed token: random weights accept nothing, so the
  acceptance length is a parameter (--tau, tokens committed per verification,
  bonus included): tree verification costs device-ms per verification / tau,
  the plain API its device-ms per token; their ratio is the speed-up on the
  device at that tau;
- where a step's time goes: per step, the host's packing, launch, readback and
  per-item Python, and the forward alone (CUDA events around the replay on a
  GPU, wall time around the step on a CPU), for the latency calls (the
  forward-alone median beside each latency) and each throughput window.

Each session's context is held at --context tokens (what a verification
commits is dropped again), so every measurement runs at the same length.
Ratios to the generic engine are measured in the same run.

--packed-weights: a float32 target on a CPU holds each linear's weight twice,
once packed for oneDNN's multi-row products, as the server does
(``shared/packed_weights.py``); ``compare`` runs every engine with them and
without (``NAME-unpacked``) on the one loaded model, taking turns call by call.
"""
from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from .records import markdown_table

ENGINES = {"generic": "a DynamicCache per session, one forward each",
           "batched": "the KV pool, one forward for all sessions, as the server builds it on the device",
           "batched-eager": "the KV pool as batched builds it, with no CUDA graphs (the eager baseline in the same run)",
           "bucketed": "the KV pool with shape buckets forced on (a CUDA graph per bucket on a GPU)"}


def random_tree(rng: random.Random, nodes: int, vocab: int, max_depth: int = 6):
    """A random DraftTree of `nodes` nodes whose depth stays within max_depth."""
    from edgespec.shared.tree import ROOT, DraftTree

    tokens: list[int] = []
    parents: list[int] = []
    depth: list[int] = []
    for _ in range(nodes):
        choices = [ROOT] + [i for i, d in enumerate(depth) if d < max_depth]
        parent = rng.choice(choices)
        tokens.append(rng.randrange(vocab))
        parents.append(parent)
        depth.append(1 if parent == ROOT else depth[parent] + 1)
    return DraftTree(tuple(tokens), tuple(parents))


@dataclass
class LatencyRow:
    engine: str
    nodes: int  # 0 = one plain decode step
    median_ms: float
    ratio: float  # to this engine's plain decode step
    device_ms: float = 0.0  # median of the forward alone (``StepTimes.device_ns``) per call


@dataclass
class ThroughputRow:
    engine: str
    sessions: int
    verifications_per_s: float
    verify_device_ms: float  # device time per verification
    tokens_per_s: float  # plain API, all generations together
    token_device_ms: float  # plain API: device time per generated token
    batch: float  # mean items per forward (verification runs)
    parts_ms: dict | None = None  # verification window: each step part's mean per step (``StepTimes.per_step_ms``)


class Bench:
    """One target, one engine, its scheduler, and sessions held at a fixed context."""

    def __init__(self, target, engine, context: int, seed: int = 0, name: str | None = None,
                 packed: bool | None = None):
        from edgespec.server import ModelScheduler

        self.target, self.engine, self.context = target, engine, context
        self.packed = packed  # None: the model's packed weights as they are; else on or off for this bench's calls
        self.name = name or engine.name  # the row label: two benches may share an engine class
        self.scheduler = ModelScheduler(engine)
        self.rng = random.Random(seed)

    def session(self, name: str):
        from edgespec.server import VerifierSession
        from edgespec.shared.session_settings import SessionSettings

        s = VerifierSession(SessionSettings(name), self.target, self.scheduler, max_context_tokens=1 << 20)
        s.open([self.rng.randrange(min(1000, self.target.vocab_size)) for _ in range(self.context)])
        return s

    @staticmethod
    def verify_and_rewind(session, tree, rewind_to: int):
        result = session.verify(session.steps + 1, len(session.committed), tree)
        session.committed = session.committed[:rewind_to]  # hold the context: drop what was committed
        session.kv.crop(rewind_to - 1)
        return result

    def _use_packed(self) -> None:
        if self.packed is not None:
            from edgespec.shared.packed_weights import set_packed

            set_packed(self.target.model, self.packed)

    def decode_once(self) -> tuple[float, float]:
        """Seconds of one plain decode step (one token) on the latency session, its context held; and of its
        forward alone."""
        self._use_packed()
        s = self._latency_session()
        before = self.engine.times.copy()
        t0 = time.perf_counter()
        self.scheduler.run_job(self.scheduler.prefill(s.kv, [s.committed[-1]]), s.kv)
        took = time.perf_counter() - t0
        s.kv.crop(len(s.committed) - 1)
        return took, self.engine.times.minus(before).device_ns / 1e9

    def verify_once(self, nodes: int) -> tuple[float, float]:
        """Server seconds of one verification of a random tree of `nodes` nodes (forward, acceptance, KV); and
        of its forward alone."""
        self._use_packed()
        s = self._latency_session()
        tree = random_tree(self.rng, nodes, self.target.vocab_size)
        before = self.engine.times.copy()
        took = self.verify_and_rewind(s, tree, len(s.committed)).timings.total_ns / 1e9
        return took, self.engine.times.minus(before).device_ns / 1e9

    def _latency_session(self):
        if not hasattr(self, "_latency"):
            self._latency = self.session("latency")
        return self._latency

    def throughput(self, sessions: int, tree_nodes: int, seconds: float) -> ThroughputRow:
        self._use_packed()
        with ThreadPoolExecutor(sessions) as pool:
            opened = list(pool.map(self.session, [f"tp-{i}" for i in range(sessions)]))
        vocab = self.target.vocab_size

        def verify(i: int, stop: threading.Event, counts: list[int], ready: list[bool]) -> None:
            rng, s = random.Random(i), opened[i]
            n = len(s.committed)
            ready[i] = True
            while not stop.is_set():
                self.verify_and_rewind(s, random_tree(rng, tree_nodes, vocab), n)
                counts[i] += 1

        times0 = self.engine.times.copy()
        verifications, verify_ns, s0 = self._window(sessions, seconds, verify)
        parts = self.engine.times.minus(times0).per_step_ms()  # the whole window, warm-up included
        batch = (self.scheduler.stats.items - s0.items) / max(1, self.scheduler.stats.forwards - s0.forwards)
        for s in opened:
            s.kv.close()
        tokens, token_ns, _ = self._window(sessions, seconds, self._generate)
        return ThroughputRow(self.name, sessions, verifications / seconds, verify_ns / 1e6 / max(1, verifications),
                             tokens / seconds, token_ns / 1e6 / max(1, tokens), batch, parts)

    def _generate(self, i: int, stop: threading.Event, counts: list[int], ready: list[bool]) -> None:
        """A plain-API generation (the server decoding alone) until stopped, its context held."""
        from edgespec.server import decode_step
        from edgespec.shared.session_contract import SamplingSettings
        from edgespec.shared.verification import Draws

        rng = random.Random(1000 + i)
        kv, greedy, draws = self.scheduler.new_kv(), SamplingSettings(), Draws(0)
        prompt = [rng.randrange(min(1000, self.target.vocab_size)) for _ in range(self.context)]
        token, _ = self.scheduler.run_job(decode_step(self.scheduler, kv, prompt, greedy, draws), kv)
        ready[i] = True
        while not stop.is_set():
            token, _ = self.scheduler.run_job(decode_step(self.scheduler, kv, [token], greedy, draws), kv)
            kv.crop(self.context)  # hold the context
            counts[i] += 1
        kv.close()

    def _window(self, threads: int, seconds: float, work) -> tuple[int, int, object]:
        """Run work(i, stop, counts, ready) on threads; (count, device ns) in a window of `seconds` that opens
        once every thread is past its setup."""
        counts, ready = [0] * threads, [False] * threads
        stop = threading.Event()
        runners = [threading.Thread(target=work, args=(i, stop, counts, ready), daemon=True) for i in range(threads)]
        for r in runners:
            r.start()
        while not all(ready):
            time.sleep(0.01)
        time.sleep(min(1.0, seconds / 4))  # past the first batches' shapes
        c0, s0 = sum(counts), replace(self.scheduler.settle())
        time.sleep(seconds)
        c1, busy = sum(counts), self.scheduler.settle().busy_ns - s0.busy_ns
        stop.set()
        for r in runners:
            r.join()
        return c1 - c0, busy, s0

    def warm_up(self, seconds: float) -> None:
        """Verify and decode for a while, unmeasured (first calls of each shape are slow)."""
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.verify_once(16)
            self.decode_once()

    def close(self) -> None:
        if hasattr(self, "_latency"):
            self._latency.kv.close()
        self.scheduler.close()


def measure_latency(benches: list[Bench], tree_sizes: list[int], repeats: int) -> list[LatencyRow]:
    """Medians of `repeats`, the engines taking turns call by call: a machine's load (other processes on a
    shared CPU) then weighs on all of them alike."""
    def medians(call) -> dict[str, tuple[float, float]]:
        times = {b.name: [] for b in benches}
        for _ in range(repeats):
            for b in benches:
                times[b.name].append(call(b))
        return {name: (statistics.median(t for t, _ in v), statistics.median(d for _, d in v))
                for name, v in times.items()}

    base = medians(Bench.decode_once)
    rows = [LatencyRow(name, 0, t * 1e3, 1.0, d * 1e3) for name, (t, d) in base.items()]
    for nodes in tree_sizes:
        rows += [LatencyRow(name, nodes, t * 1e3, t / base[name][0], d * 1e3)
                 for name, (t, d) in medians(lambda b: b.verify_once(nodes)).items()]
    return rows


def print_report(name: str, latency: list[LatencyRow], throughput: list[ThroughputRow], taus: list[float],
                 context: int, repeats: int, tree_nodes: int, seconds: float) -> None:
    engines = list(dict.fromkeys(r.engine for r in latency + throughput))
    base, right = engines[0], lambda n: ["---"] + ["---:"] * (n - 1)  # noqa: E731
    by = {(r.engine, r.nodes): r for r in latency}
    rows = [["decode step" if nodes == 0 else nodes]
            + [c for e in engines for c in (f"{by[e, nodes].median_ms:.1f}", f"{by[e, nodes].device_ms:.2f}",
                                            f"{by[e, nodes].ratio:.2f}")]
            + [f"{by[e, nodes].median_ms / by[base, nodes].median_ms:.2f}" for e in engines[1:]]
            for nodes in dict.fromkeys(r.nodes for r in latency)]
    print(f"\n## {name}: verify latency, one session (context {context}, median of {repeats}; forward = the "
          f"forward alone; x decode = multiple of the engine's own decode step)")
    print(markdown_table(["tree nodes"] + [c for e in engines for c in (f"{e} ms", "forward ms", "x decode")]
                         + [f"{e}/{base}" for e in engines[1:]], rows, "---:"))
    tp = {(r.engine, r.sessions): r for r in throughput}
    points = [tp[e, n] for e in engines for n in dict.fromkeys(r.sessions for r in throughput)]
    print(f"\n## {name}: throughput ({tree_nodes}-node random trees; plain API = the server decoding alone; "
          f"{seconds:g} s a point)")
    print(markdown_table(["engine", "sessions", "verifications/s", "device-ms / verification", "mean batch",
                          "plain API tokens/s", "device-ms / token", f"verifications/s vs {base}"],
                         [[r.engine, r.sessions, f"{r.verifications_per_s:.2f}", f"{r.verify_device_ms:.1f}",
                           f"{r.batch:.1f}", f"{r.tokens_per_s:.2f}", f"{r.token_device_ms:.1f}",
                           f"{r.verifications_per_s / tp[base, r.sessions].verifications_per_s:.2f}"] for r in points],
                         right(8)))
    parts = ("pack", "launch", "device", "readback", "items")
    print(f"\n## {name}: where a verification step's time goes (ms per step; device = the forward alone)")
    print(markdown_table(["engine", "sessions", "steps"] + list(parts),
                         [[r.engine, r.sessions, f"{(r.parts_ms or {}).get('steps', 0):.0f}"]
                          + [f"{(r.parts_ms or {}).get(p, 0.0):.2f}" for p in parts] for r in points], right(3 + len(parts))))
    print(f"\n## {name}: device-ms per committed token (tau = tokens committed per verification, bonus included)")
    print(markdown_table(["engine", "sessions", "plain API"] + [c for t in taus for c in (f"tree, tau {t:g}", "speed-up")],
                         [[r.engine, r.sessions, f"{r.token_device_ms:.1f}"]
                          + [c for t in taus for c in (f"{r.verify_device_ms / t:.1f}",
                                                       f"{r.token_device_ms * t / r.verify_device_ms:.2f}x")]
                          for r in points], right(3 + 2 * len(taus))))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b-instruct"],
                        help="registry names or model folders (e.g. from `edgespec models random`)")
    parser.add_argument("--engines", nargs="+", default=["generic", "batched"], choices=list(ENGINES),
                        help="the first is the baseline of the ratios; " + "; ".join(f"{k}: {v}" for k, v in
                                                                                     ENGINES.items()))
    parser.add_argument("--enforce-eager", action="store_true",
                        help="batched and bucketed capture no CUDA graphs (the server's --enforce-eager)")
    parser.add_argument("--tree-sizes", nargs="+", type=int, default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--sessions", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--tau", nargs="+", type=float, default=[1, 3, 5], help="acceptance lengths to cost at")
    parser.add_argument("--context", type=int, default=256, help="tokens of context every session holds")
    parser.add_argument("--repeats", type=int, default=10, help="verifications per tree size (median)")
    parser.add_argument("--tree-nodes", type=int, default=16, help="tree size in the throughput runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each throughput window")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of unmeasured work per engine first")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--packed-weights", choices=["auto", "on", "off", "compare"], default="auto",
                        help="oneDNN-packed weights for multi-row products (the server's --packed-weights; auto: "
                             "float32 on a CPU); compare: every engine with them and without (NAME-unpacked)")


def run(args: argparse.Namespace) -> int:
    import torch

    from edgespec.server import PoolConfig, TargetModel, build_engine
    from edgespec.shared.packed_weights import pack_linears, packed_weights_wanted
    from edgespec.shared.models.loading import load_model

    for name in args.models:
        target = TargetModel(load_model(name, device=args.device, dtype=args.dtype))
        asked = {"auto": None, "on": True, "off": False, "compare": True}[args.packed_weights]
        packed = packed_weights_wanted(target.device, target.dtype, asked)
        variants = [(True, ""), (False, "-unpacked")] if packed and args.packed_weights == "compare" else [(None, "")]
        cuda = target.device.type == "cuda"
        pool = PoolConfig(max_kv_bytes=1 << 50, max_seqs=max(args.sessions) + 2,
                          max_context_tokens=args.context + 8, max_tree_nodes=max(args.tree_sizes + [args.tree_nodes]))
        pools = {"generic": pool, "batched": replace(pool, shape_buckets=cuda, graphs=cuda and not args.enforce_eager),
                 "batched-eager": replace(pool, shape_buckets=cuda, graphs=False),
                 "bucketed": replace(pool, shape_buckets=True, graphs=not args.enforce_eager)}
        print(f"# {target.name} on {target.device} ({str(target.dtype).removeprefix('torch.')}), "
              f"torch threads {torch.get_num_threads()}", flush=True)
        benches = [Bench(target, build_engine(target, "generic" if kind == "generic" else "batched", pools[kind]),
                         args.context, name=kind + suffix, packed=on) for kind in args.engines for on, suffix in variants]
        if packed:  # after the engines: their fusions read the model's own modules
            print(f"packed weights: {pack_linears(target.model)} linears", flush=True)
        try:
            for b in benches:
                print(f"engine {b.name}: {b.engine.describe()}", flush=True)
                b.warm_up(args.warmup)
            latency = measure_latency(benches, args.tree_sizes, args.repeats)
            throughput: list[ThroughputRow] = []
            for n in args.sessions:  # engines in turn at each session count
                for b in benches:
                    throughput.append(b.throughput(n, args.tree_nodes, args.seconds))
                    r = throughput[-1]
                    print(f"  {r.engine}, {n} sessions: {r.verifications_per_s:.2f} verifications/s, "
                          f"plain API {r.tokens_per_s:.2f} tokens/s", flush=True)
        finally:
            for b in benches:
                b.close()
        print_report(target.name, latency, throughput, args.tau, args.context, args.repeats, args.tree_nodes,
                     args.seconds)
    return 0

