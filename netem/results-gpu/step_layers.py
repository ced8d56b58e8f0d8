"""Where a batched decode step's time goes on a GPU, layer by layer (run by netem/results-gpu/run.sh):

    python3 netem/results-gpu/step_layers.py MODEL_DIR [--context 512]

For one session at --context tokens, medians of 50 (ms):
- replay: the captured graph of the decode bucket alone (CUDA events around graph.replay());
- runner: the upload of a packed batch, the replay and the readback (host clock, synchronised);
- engine: BatchedEngine.run of one decode item (packing, runner, acceptance bookkeeping);
- scheduler: the same through the model thread (ModelScheduler.run_job), as a server's session calls it.
The differences are the host's share of each layer. Then the ATen operations one eager step of that bucket
dispatches, views and reshapes left out: on a GPU each is a kernel, and a captured graph replays every one.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch

from edgespec.netem.bench.server_engines import Bench
from edgespec.server.engine import Work
from edgespec.server.engine_batched import PoolConfig
from edgespec.server.engine_choice import build_engine
from edgespec.server.engine_step import pack_batch
from edgespec.server.target import TargetModel
from edgespec.shared.models.loading import load_model

# Operations that make no kernel of their own: views, and the ops that only relabel a tensor.
NO_KERNEL = {"view", "_unsafe_view", "unsqueeze", "squeeze", "transpose", "permute", "expand", "slice", "select", "t",
             "alias", "unbind", "split", "as_strided", "detach", "reshape", "unflatten", "lift_fresh"}


def kernel_ops(step, packed: torch.Tensor, bucket) -> Counter:
    """The ATen operations of one eager run of the step, by name, those that make no kernel left out."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ not in NO_KERNEL:
                self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Count() as count:
        step(packed, bucket)
    return count.ops


def median_ms(fn, n: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    target = TargetModel(load_model(args.model, dtype="bfloat16"))
    pool = PoolConfig(max_kv_bytes=1 << 50, max_slots=4, max_context_tokens=args.context + 8, max_tree_nodes=64,
                      shape_buckets=True, graphs=True)
    engine = build_engine(target, "batched", pool)
    bench = Bench(target, engine, args.context)
    session = bench.session("layers")
    kv = session.kv
    token = session.committed[-1]
    past = len(kv)

    work = Work.chunk([token], 0)

    def engine_run():
        engine.run([(kv, work)])
        kv.crop(past)

    bucket, in_grid = engine.bucket([work], past + 1)
    flat = pack_batch([(kv.ensure_slot(), past, work, work.accept)], bucket, engine.pool.scratch, list(range(bucket.head)))

    def runner():
        engine.runner(flat, bucket).readback.tolist()

    rows = {}
    captured = getattr(engine.runner, "graphs", {}).get(bucket)
    if captured is not None:  # on CUDA
        graph = captured[0]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def replay() -> float:
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        for _ in range(5):
            replay()
        rows["replay (CUDA events)"] = statistics.median(replay() for _ in range(50))
    rows.update({"runner (upload, replay, readback)": median_ms(runner),
                 "engine.run (one decode item)": median_ms(engine_run),
                 "scheduler (model thread, as a session)": median_ms(lambda: bench.decode_once())})
    print(f"# {target.name}: decode step layers, bucket {bucket} (grid: {in_grid}), context {args.context}")
    print("| layer | median ms |\n|---|---:|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} |")
    ops = kernel_ops(engine.step, torch.tensor(flat, device=target.device), bucket)
    per_layer = sum(ops.values()) / target.num_layers
    print(f"\nkernels one eager step dispatches: {sum(ops.values())} ({target.num_layers} layers, {per_layer:.1f} a layer "
          f"with the step's own share spread); most frequent: "
          + ", ".join(f"{k} {v}" for k, v in ops.most_common(12)))
    bench.close()


if __name__ == "__main__":
    main()
