"""Server benchmark: verify latency against tree size and one plain decode step, and throughput
with N concurrent sessions over real gRPC on loopback.

    python -m edgespec.server.bench --models qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct

Latency: a session with a prompt of --context tokens verifies random trees of
1..64 nodes (depth up to 6, as an EAGLE-2 tree would have); the figure is the
server time per verification (forward, acceptance, KV bookkeeping), median of
--repeats, and its ratio to one plain decode step (one token on the same
cache) measured in the same run.

Throughput: N client threads, each with its own session and stream, send
trees of --tree-nodes nodes as fast as answers come back for --seconds; the
figures are verifications per second over all sessions and the mean round
trip. Drafts are random, so each verification commits one token: this measures
the server's verification capacity, not a drafter's acceptance.
"""
from __future__ import annotations

import argparse
import queue
import random
import statistics
import threading
import time
from dataclasses import dataclass

import torch

from edgespec.shared.tree import ROOT, DraftTree


def random_tree(rng: random.Random, nodes: int, vocab: int, max_depth: int = 6) -> DraftTree:
    """A random tree of `nodes` nodes whose depth stays within max_depth."""
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
    model: str
    nodes: int  # 0 = one plain decode step
    median_ms: float
    ratio: float  # to the plain decode step


def measure_latency(target, tree_sizes: list[int], context: int, repeats: int, seed: int = 0) -> list[LatencyRow]:
    from .scheduler import ModelScheduler
    from .session import SessionSettings, VerifierSession

    rng = random.Random(seed)
    scheduler = ModelScheduler()
    try:
        session = VerifierSession(SessionSettings("bench"), target, scheduler, max_context_tokens=1 << 20)
        session.open([rng.randrange(min(1000, target.vocab_size)) for _ in range(context)])
        decode = []
        for _ in range(repeats + 1):  # the first pass warms up
            cache_len = target.cache_len(session.cache)
            t0 = time.perf_counter()
            target.prefill(session.cache, [session.committed[-1]])
            decode.append(time.perf_counter() - t0)
            target.crop(session.cache, cache_len)
        base = statistics.median(decode[1:])
        rows = [LatencyRow(target.name, 0, base * 1e3, 1.0)]
        step = 0
        for nodes in tree_sizes:
            times = []
            for _ in range(repeats + 1):
                step += 1
                tree = random_tree(rng, nodes, target.vocab_size)
                result = session.verify(step, len(session.committed), tree)
                times.append(result.timings.total_ns / 1e9)
            median = statistics.median(times[1:])
            rows.append(LatencyRow(target.name, nodes, median * 1e3, median / base))
        return rows
    finally:
        scheduler.close()


@dataclass
class ThroughputRow:
    model: str
    sessions: int
    verifications_per_s: float
    mean_round_trip_ms: float
    mean_queue_ms: float


def measure_throughput(handle, sessions: int, tree_nodes: int, seconds: float, context: int) -> ThroughputRow:
    import grpc

    from edgespec.proto.edgespec.v1 import pb, pb_grpc
    from edgespec.shared.tree import encode_tree

    target = handle.core.target
    counts = [0] * sessions
    trips: list[float] = []
    queues: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(sessions + 1)
    stop = threading.Event()

    def client(i: int) -> None:
        rng = random.Random(i)
        with grpc.insecure_channel(handle.address) as channel:
            requests: queue.Queue = queue.Queue()
            replies = pb_grpc.VerifierStub(channel).Session(iter(requests.get, None))
            sid = f"bench-{sessions}-{i}"
            requests.put(pb.ClientMessage(open=pb.Open(
                session_id=sid, prompt_ids=[rng.randrange(min(1000, target.vocab_size)) for _ in range(context)],
                tokenizer_fingerprint=target.fingerprint)))
            committed = next(replies).opened.committed_len
            start.wait()
            step = 0
            while not stop.is_set():
                step += 1
                tree = random_tree(rng, tree_nodes, target.vocab_size)
                t0 = time.perf_counter()
                requests.put(pb.ClientMessage(draft=pb.Draft(session_id=sid, step=step, committed_len=committed,
                                                             tree=encode_tree(tree))))
                v = next(replies).verified
                trip = time.perf_counter() - t0
                committed = v.committed_len
                if not stop.is_set():
                    counts[i] += 1
                    with lock:
                        trips.append(trip)
                        queues.append(v.timings.queue_ns / 1e9)
            requests.put(pb.ClientMessage(close=pb.Close(session_id=sid)))
            next(replies)
            requests.put(None)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(sessions)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    elapsed = time.perf_counter() - t0
    for t in threads:
        t.join()
    return ThroughputRow(target.name, sessions, sum(counts) / elapsed,
                         statistics.mean(trips) * 1e3 if trips else float("nan"),
                         statistics.mean(queues) * 1e3 if queues else float("nan"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
    parser.add_argument("--tree-sizes", nargs="+", type=int, default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--sessions", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--context", type=int, default=256, help="prompt tokens before the trees")
    parser.add_argument("--repeats", type=int, default=10, help="verifications per tree size (median)")
    parser.add_argument("--tree-nodes", type=int, default=16, help="tree size in the throughput runs")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each throughput run")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from .app import ServerConfig, start_server

    latency: list[LatencyRow] = []
    throughput: list[ThroughputRow] = []
    for name in args.models:
        with start_server(ServerConfig(model=name, device=args.device, dtype=args.dtype, http_port=None,
                                       max_sessions=max(args.sessions) + 1)) as handle:
            target = handle.core.target
            print(f"# {name} on {target.device} ({str(target.dtype).removeprefix('torch.')}), "
                  f"torch threads {torch.get_num_threads()}", flush=True)
            latency += measure_latency(target, args.tree_sizes, args.context, args.repeats)
            for n in args.sessions:
                throughput.append(measure_throughput(handle, n, args.tree_nodes, args.seconds, args.context))
                print(f"  {n} sessions: {throughput[-1].verifications_per_s:.2f} verifications/s", flush=True)

    print(f"\nVerify latency (context {args.context} tokens, median of {args.repeats}; "
          f"nodes 0 = one plain decode step)")
    print("| model | tree nodes | verify ms | x decode step |")
    print("|---|---:|---:|---:|")
    for row in latency:
        label = "decode step" if row.nodes == 0 else str(row.nodes)
        print(f"| {row.model} | {label} | {row.median_ms:.1f} | {row.ratio:.2f} |")
    print(f"\nThroughput over gRPC loopback ({args.tree_nodes}-node random trees, {args.seconds:g} s a run)")
    print("| model | sessions | verifications/s | mean round trip ms | mean queue ms |")
    print("|---|---:|---:|---:|---:|")
    for row in throughput:
        print(f"| {row.model} | {row.sessions} | {row.verifications_per_s:.2f} | {row.mean_round_trip_ms:.1f} "
              f"| {row.mean_queue_ms:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
