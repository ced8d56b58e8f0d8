"""The batched engine's device step is graph-ready (issue 24), proven on a CPU with the tiny target.

- dynamo traces the step of every bucket of a small grid in one graph, no break;
- the step compiled (fullgraph, aot_eager) is bitwise the eager step in float32;
- over a run of mixed sessions and tree sizes, dynamo compiles one graph per distinct bucket used;
- counted on the model thread, a greedy verification without features costs one upload and one readback
  per batch; features, logprobs and sampling add what they need, no more;
- on a CUDA device (skipped without one) a step launches with synchronisation forbidden.
"""
from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from edgespec.server.engine.base import Work
from edgespec.server.engine.batched import BatchedEngine, PoolConfig, grid
from edgespec.server.engine.step import Bucket, pack_batch
from edgespec.server.scheduler import ModelScheduler, SchedulerConfig
from edgespec.server.session import VerifierSession
from edgespec.server.target import TargetModel
from edgespec.shared.models.loading import load_model
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.session_settings import FeatureRequest, SessionSettings
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.wire import FeatureKind

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def target(tiny_model_dir) -> TargetModel:
    return TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32"))


def engine(target, **kw) -> BatchedEngine:
    return BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=8, max_context_tokens=256, **kw))


def random_tree(rng: random.Random, nodes: int) -> DraftTree:
    parents = tuple(rng.choice([ROOT] + list(range(i))) for i in range(nodes))
    return DraftTree(tuple(rng.randrange(300) for _ in range(nodes)), parents)


def tree_work(rng: random.Random, nodes: int, past: int, accept: bool = True) -> Work:
    return Work.tree(rng.randrange(300), random_tree(rng, nodes), past, accept)


def packed(eng: BatchedEngine, works: list[Work], pasts: list[int], bucket: Bucket) -> torch.Tensor:
    """The step's input for these works after `pasts` positions each, in blocks of sessions made for them (two
    engines built alike hand out the same blocks)."""
    kvs = [eng.new_kv() for _ in works]
    for kv, p, w in zip(kvs, pasts, works):
        kv.grow_to(p + len(w))
    items = [(kv.blocks, p, w, w.accept) for kv, p, w in zip(kvs, pasts, works)]
    starts = [sum(len(w) for w in works[:i]) for i in range(len(works))]
    head = [s + r for s, w in zip(starts, works) for r in range(w.logits_from, len(w))]
    out = torch.tensor(pack_batch(items, bucket, eng.pool.scratch, head), dtype=torch.long)
    eng.held = kvs  # the blocks stay taken while the test uses them
    return out


GRID = [Bucket(1, 1, 256), Bucket(8, 2, 256), Bucket(32, 4, 512)]  # rows, sessions, keys


@pytest.mark.slow
@pytest.mark.parametrize("bucket", GRID, ids=lambda b: f"N{b.rows}-S{b.seqs}-K{b.keys}")
@pytest.mark.parametrize("part", ["decode", "finish"])
def test_the_step_of_every_bucket_traces_in_one_graph(target, bucket, part):
    """Each bucket part of the step (the decoder; acceptance and compaction) is one graph without a break."""
    import torch._dynamo

    eng = engine(target, shape_buckets=True)
    rng = random.Random(bucket.rows)
    per = bucket.rows // bucket.seqs
    works = [tree_work(rng, per - 1, 5 + i) for i in range(bucket.seqs)]
    flat = packed(eng, works, [5 + i for i in range(bucket.seqs)], bucket)[:bucket.packed]
    torch._dynamo.reset()
    with torch.no_grad():
        if part == "decode":
            explained = torch._dynamo.explain(eng.step.decode)(flat, bucket)
        else:
            _, sees = eng.step.decode(flat, bucket)
            best = torch.randint(0, 300, (bucket.rows,))
            explained = torch._dynamo.explain(eng.step.finish)(flat, bucket, sees, best)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_the_compiled_step_is_bitwise_the_eager_step(target, attention):
    """Same batches through an eager and an aot_eager-compiled engine: hidden, logits, readback and the whole
    KV pool equal bit for bit (float32), with either attention."""
    import torch._dynamo

    torch._dynamo.reset()
    eager = engine(target, shape_buckets=True, attention=attention)
    compiled = engine(target, shape_buckets=True, compile_backend="aot_eager", attention=attention)
    rng = random.Random(0)
    for step in range(2):
        works = [tree_work(rng, rng.randint(1, 7), 9 * step + i) for i in range(3)]
        pasts = [9 * step + i for i in range(3)]
        bucket, _ = eager.bucket(works, max(p + len(w) for p, w in zip(pasts, works)))
        flat = packed(eager, works, pasts, bucket).tolist()
        with torch.no_grad():
            a = eager.runner(flat, bucket)
            b = compiled.runner(flat, bucket)
        assert torch.equal(a.hidden, b.hidden) and torch.equal(a.logits, b.logits)
        assert torch.equal(a.readback, b.readback)
        assert torch.equal(eager.pool.kv, compiled.pool.kv)


def test_the_lm_head_runs_on_the_rows_whose_logits_are_used(target):
    """A batch of a 17-node tree, two decode rows and a prompt chunk without logits, padded to a grid bucket: the
    LM head (the model's own module, hooked) sees the tree's 18 rows and the 2 decode rows, no prompt row and no
    padding row; the bucket is the batch's total rows rounded up the grid, not its sessions times its longest."""
    eng = engine(target, shape_buckets=True)
    seen: list[int] = []
    hook = target.model.get_output_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    try:
        kvs = [eng.new_kv() for _ in range(4)]
        for kv in kvs:
            eng.run([(kv, Work.chunk(list(range(3, 20)), 0, logits=False))])
        seen.clear()
        rng = random.Random(3)
        works = [tree_work(rng, 17, 17), Work.chunk([5], 17), Work.chunk([6], 17),
                 Work.chunk(list(range(30, 40)), 17, logits=False)]
        outs = eng.run(list(zip(kvs, works)))
    finally:
        hook.remove()
    bucket, in_grid = eng.bucket(works, 17 + 18)
    assert in_grid and bucket.rows == 32 and sum(len(w) for w in works) == 30  # 30 rows: 32, not 4 x 32
    assert seen == [18 + 1 + 1], seen
    assert [len(o.logits) for o in outs] == [18, 1, 1, 0]
    assert outs[0].accepted is not None and len(outs[0].best) == 18


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_compiled_graphs_are_the_distinct_buckets_used(target, attention):
    """Mixed sessions (prompts, trees of 0-20 nodes, one to four sessions a batch) on a compiled engine: one graph
    of each bucket part per distinct bucket, no recompilation within a bucket (whatever the head rows), with
    either attention."""
    import torch._dynamo

    torch._dynamo.reset()
    graphs: list = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    eng = engine(target, shape_buckets=True, compile_backend=counting_backend, attention=attention)
    used: list[Bucket] = []
    runner = eng.runner
    eng.runner = lambda flat, bucket: (used.append(bucket), runner(flat, bucket))[1]
    scheduler = ModelScheduler(eng, SchedulerConfig(prefill_chunk=16))
    try:
        def session(seed: int) -> None:
            rng = random.Random(seed)
            s = VerifierSession(SessionSettings(f"s{seed}"), target, scheduler, 200)
            s.open([rng.randrange(256) for _ in range(rng.randint(2, 40))])
            for step in range(1, 4):
                s.verify(step, len(s.committed), random_tree(rng, rng.randint(0, 20)))

        threads = [threading.Thread(target=session, args=(i,)) for i in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        # How the threads meet in batches is up to the OS; one session alone, with a short prompt and trees
        # of 1, 12 and 20 nodes, adds batch-1 buckets of several widths whatever the threads did.
        alone = VerifierSession(SessionSettings("alone"), target, scheduler, 200)
        alone.open([1, 2, 3])
        for step, nodes in enumerate((1, 12, 20), start=1):
            alone.verify(step, len(alone.committed), random_tree(random.Random(nodes), nodes))
    finally:
        scheduler.close()
    assert len(set(used)) > 3, ("the run should span several buckets", sorted(set(used), key=str))
    # a graph of each bucket part (the decoder; acceptance and compaction) per bucket, and no other
    assert len(graphs) == 2 * len(set(used)), (len(graphs), sorted(set(used), key=str))


def test_every_batch_the_scheduler_forms_has_a_captured_bucket(target):
    """The grid a server captures (64 sessions + 8 API slots, 4k context) with the pool attention: row counts
    1, 2, 3, 4, 6, ... 2,048 times 4 key lengths, and every batch within the scheduler's budget (padded rows <=
    2,048) lands on one of its buckets, prompt chunks included; the padding is at most a third of a bucket."""
    config = PoolConfig(max_kv_bytes=1 << 40, max_seqs=72, max_context_tokens=4096, shape_buckets=True,
                        attention="flex")
    eng = BatchedEngine(target, config)
    config = eng.config  # auto's choices made (the block size)
    buckets = set(grid(config))
    assert len(buckets) == 22 * 4 and {b.keys for b in buckets} == {256, 1024, 4096, config.session_tokens}
    assert eng.bucket([Work.chunk([1] * 256, 0)], 300) == (Bucket(256, 64, 1024, 64), True)
    assert eng.bucket([Work.chunk([1] * 18, 0)] + [Work.chunk([1], 0)] * 15, 300)[0].rows == 48  # not 16 x 32
    rng = random.Random(0)
    for _ in range(300):
        works = [Work.chunk([1] * rng.randint(1, 512), 0) for _ in range(rng.randint(1, 64))]
        if eng.cost(works) > 2048:
            continue
        bucket, in_grid = eng.bucket(works, rng.randint(1, config.session_tokens))
        assert in_grid and bucket in buckets, bucket
        assert bucket.rows <= 1.5 * sum(len(w) for w in works) or bucket.rows <= 2, bucket


def test_sdpa_leaves_its_largest_masks_out_of_the_grid(target):
    """With SDPA a bucket's dense mask is rows x sessions x keys: past ``sdpa_grid_limit`` a bucket is not captured
    and its batches run at their own shape."""
    config = PoolConfig(max_kv_bytes=1 << 40, max_seqs=72, max_context_tokens=4096, shape_buckets=True,
                        attention="sdpa")
    eng = BatchedEngine(target, config)
    buckets = grid(eng.config)
    assert buckets and all(b.rows * b.seqs * b.keys <= config.sdpa_grid_limit for b in buckets)
    big = [Work.chunk([1] * 32, 0)] * 64
    bucket, in_grid = eng.bucket(big, 4000)
    assert not in_grid and (bucket.rows, bucket.seqs) == (2048, 64)


class TransferCounter(TorchDispatchMode):
    """Host<->device traffic of one thread: uploads are tensors made from host data (``torch.tensor``, list
    indices); readbacks are scalar reads (``.item()``, ``int()``) and ``tolist`` / ``cpu`` / ``numpy`` / ``to("cpu")``
    calls. On a CPU nothing moves, but each is a transfer (and a synchronisation) on an accelerator."""

    READS = ("tolist", "cpu", "numpy")

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()
        self.thread = None
        self.paused = False
        self._saved = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            if func is torch.ops.aten.lift_fresh.default:
                self.counts["upload"] += 1
            elif func is torch.ops.aten._local_scalar_dense.default:
                self.counts["readback"] += 1
        return func(*args, **(kwargs or {}))

    def install(self) -> None:
        """Patch the Tensor methods that read back (counted on the model thread only); enter on that thread."""
        self.thread = threading.get_ident()
        for name in self.READS + ("to",):
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def wrapped(tensor, *args, _original=original, _name=name, **kwargs):
                if threading.get_ident() == self.thread and not self.paused and (
                        _name != "to" or "cpu" in (*args, kwargs.get("device"))):  # to("cpu"): host code's
                    # readback; a move to the tensor's own device (x.device) is not one
                    self.counts["readback"] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, wrapped)
        self.__enter__()

    def uninstall(self) -> None:
        self.__exit__(None, None, None)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)


def test_a_batch_of_greedy_sessions_makes_one_upload_and_one_readback(target):
    """Four sessions verifying at once, their trees in shared batches: still one upload and one readback a batch."""
    eng = engine(target)
    scheduler = ModelScheduler(eng)
    counter = TransferCounter()
    try:
        sessions = [VerifierSession(SessionSettings(f"s{i}"), target, scheduler, 200) for i in range(4)]
        for i, s in enumerate(sessions):
            s.open(list(range(10 + i, 30)))
        scheduler.run(counter.install)
        gate, running = threading.Event(), threading.Event()
        holder = threading.Thread(target=scheduler.run, args=(lambda: (running.set(), gate.wait()),))
        holder.start()
        running.wait()
        before = replace(scheduler.stats)

        def verify(s: VerifierSession, seed: int) -> None:
            rng = random.Random(seed)
            for step in range(1, 4):
                s.verify(step, len(s.committed), random_tree(rng, 9))

        threads = [threading.Thread(target=verify, args=(s, i)) for i, s in enumerate(sessions)]
        for th in threads:
            th.start()
        while scheduler.pending() < len(sessions):  # every first verification queued behind the holder
            threading.Event().wait(0.005)
        gate.set()
        for th in threads:
            th.join()
        holder.join()
        scheduler.run(counter.uninstall)
        batches = scheduler.stats.forwards - before.forwards
        assert scheduler.stats.items - before.items == 12 and batches < 12, "no batch carried two sessions"
        assert counter.counts["upload"] <= batches and counter.counts["readback"] <= batches, (counter.counts, batches)
    finally:
        scheduler.close()


def count_verifications(target, settings: SessionSettings, steps: int = 6) -> tuple[Counter, int]:
    """Transfers on the model thread over `steps` verifications of one session; (counts, batches)."""
    import edgespec.server.session as session_module

    eng = engine(target)
    scheduler = ModelScheduler(eng)
    counter = TransferCounter()
    sample_verify = session_module.sample_verify

    def host_draws(*args, **kwargs):  # the draws work on the host copy of the probabilities: not transfers
        counter.paused = True
        try:
            return sample_verify(*args, **kwargs)
        finally:
            counter.paused = False

    try:
        session = VerifierSession(settings, target, scheduler, 200)
        session.open(list(range(10, 30)))
        rng = random.Random(0)
        scheduler.run(counter.install)
        session_module.sample_verify = host_draws
        before = scheduler.stats.forwards
        try:
            for step in range(1, steps + 1):
                session.verify(step, len(session.committed), random_tree(rng, 12))
        finally:
            scheduler.run(counter.uninstall)
            session_module.sample_verify = sample_verify
        return counter.counts, scheduler.stats.forwards - before
    finally:
        scheduler.close()


def test_a_greedy_verification_makes_one_upload_and_one_readback(target):
    counts, batches = count_verifications(target, SessionSettings("g"))
    assert batches == 6
    assert counts["upload"] <= batches and counts["readback"] <= batches, counts


@pytest.mark.parametrize("what", ["hidden", "logprobs", "sampling"])
def test_features_logprobs_and_sampling_add_only_their_own_transfers(target, what):
    settings = {"hidden": SessionSettings("h", features=FeatureRequest(FeatureKind.LAST_HIDDEN)),
                "logprobs": SessionSettings("l", logprobs=2),
                "sampling": SessionSettings("s", SamplingSettings(temperature=0.8), seed=3)}[what]
    counts, batches = count_verifications(target, settings)
    assert batches == 6
    if what == "hidden":  # the accepted rows' index; their hidden states are encoded off the model thread
        assert counts["upload"] == 2 * batches and counts["readback"] == batches, counts
    elif what == "logprobs":  # the committed rows' index, and shared.logprobs.token_logprobs: the committed
        # tokens' index up, then the chosen log-probabilities, the top ids and the top values back
        assert counts["upload"] == 3 * batches and counts["readback"] == 4 * batches, counts
    else:  # the tree's distributions read back once; keeping rows off a prefix uploads their index
        assert counts["upload"] <= 2 * batches and counts["readback"] == 2 * batches, counts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_a_step_launches_without_synchronising_on_cuda(tiny_model_dir, graphs):
    cuda = TargetModel(load_model(str(tiny_model_dir), device="cuda", dtype="float32"))
    eng = BatchedEngine(cuda, PoolConfig(max_kv_bytes=1 << 30, max_seqs=4, max_context_tokens=256, shape_buckets=True,
                                         graphs=graphs, max_batch=2, max_batch_rows=16))
    rng = random.Random(0)
    works = [tree_work(rng, 6, 4), tree_work(rng, 3, 9)]
    bucket, _ = eng.bucket(works, 16)
    flat = packed(eng, works, [4, 9], bucket).tolist()
    with torch.no_grad():  # a first call compiles what it compiles (the pool attention's kernel), synchronising
        eng.runner(flat, bucket)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad():
            out = eng.runner(flat, bucket)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.readback.shape == (2, bucket.rows)


def test_a_compiled_engine_lets_dynamo_compile_a_graph_for_every_bucket(target):
    """Dynamo refuses a ninth shape of one function by default (under fullgraph, a hard error mid-serving). Its
    settings are per thread and the scheduler's thread compiles: the runner raises the limit in the thread that
    calls it, which a value set where the engine was built does not do."""
    import torch._dynamo.config as cfg

    eng = engine(target, shape_buckets=True, compile_backend="eager")
    assert eng.runner.kind == "compiled"
    seen: dict[str, int] = {}

    def worker():
        seen["before"] = cfg.recompile_limit
        eng.runner.raise_limits()  # what the runner's first call in a thread does
        seen["after"] = cfg.recompile_limit

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert seen["after"] >= 256, seen  # "before" is torch's default where its settings are per thread (8)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_the_inductor_compiled_step_writes_the_pool_in_place(target, attention):
    """Compiled by Inductor (functionalised, then re-inplaced), a step writes the KV pool where it is: the same
    storage before and after, and no allocation during the compiled step comes near the pool's size (a copy of
    the pool would be one); tokens and acceptance equal the eager step's."""
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    config = dict(max_kv_bytes=1 << 40, max_seqs=8, max_context_tokens=2048, shape_buckets=True, attention=attention)
    eager = BatchedEngine(target, PoolConfig(**config))
    compiled = BatchedEngine(target, PoolConfig(compile_backend="inductor", **config))
    tree = DraftTree((5, 6, 7), (ROOT, 0, 0))
    outs = {}
    for name, eng in (("eager", eager), ("compiled", compiled)):
        kvs = [eng.new_kv() for _ in range(2)]
        for kv in kvs:
            eng.run([(kv, Work.chunk(list(range(3, 30)), 0))])
        eng.run([(kv, Work.tree(9, tree, len(kv), accept=True)) for kv in kvs])  # compiles (compiled)
        for kv in kvs:
            kv.crop(27)
        storage = eng.pool.kv.data_ptr()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            outs[name] = [(o.best, o.accepted, o.next_token)
                          for o in eng.run([(kv, Work.tree(9, tree, len(kv), accept=True)) for kv in kvs])]
        largest = max((e.cpu_memory_usage for e in prof.events()), default=0)
        assert eng.pool.kv.data_ptr() == storage
        if name == "compiled":  # (a CPU's eager FlexAttention is PyTorch's unfused reference: it copies K and V)
            assert largest < eng.pool.kv.nbytes // 8, (name, largest, eng.pool.kv.nbytes)
    assert outs["compiled"] == outs["eager"]
