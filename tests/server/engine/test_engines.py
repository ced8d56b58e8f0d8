"""The engines on the tiny target: batched runs give exactly the tokens of one-at-a-time runs.

Every test runs on each device (cpu, and cuda where there is one). "Batched" means many
sessions' work in one forward on the KV pool; "alone" means the same sessions run one after
the other; "generic" is the DynamicCache engine. Greedy runs are also checked against the
target's own greedy decoding (no cache, full recompute).
"""
from __future__ import annotations

import random
import threading

import pytest
import torch
from support.greedy import recomputed_greedy
from support.masks import full_attention_mask
from support.trees import tree_along

from edgespec.server.decoder import GenerationRequest, generate
from edgespec.server.engine.base import Work
from edgespec.server.engine.batched import BatchedEngine, PoolConfig
from edgespec.server.engine.choice import batched_unsupported, build_engine, choose_engine
from edgespec.server.engine.generic import GenericEngine
from edgespec.server.engine.masks import batch_attention_mask
from edgespec.server.scheduler import ModelScheduler, SchedulerConfig
from edgespec.server.session import VerifierSession
from edgespec.shared.wire import ResumePolicy
from edgespec.server.target import TargetModel
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.models.loading import load_model
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.session_settings import SessionSettings
from edgespec.shared.tree import ROOT, DraftTree

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SMALL_CHUNKS = SchedulerConfig(prefill_chunk=8)  # long prompts go in several chunks, interleaved with others


@pytest.fixture(scope="module", params=DEVICES)
def target(request, tiny_model_dir) -> TargetModel:
    return TargetModel(load_model(str(tiny_model_dir), device=request.param, dtype="float32"))


class Held:
    """Holds the scheduler's worker until `waiting` items have queued up behind it, so they share a batch."""

    def __init__(self, scheduler: ModelScheduler, waiting: int):
        self.scheduler, self.waiting = scheduler, waiting
        self.running, self.gate = threading.Event(), threading.Event()
        threading.Thread(target=scheduler.run, args=(self._hold,)).start()
        self.running.wait()

    def _hold(self) -> None:
        self.running.set()
        self.gate.wait()

    def release(self) -> None:
        while self.scheduler.pending() < self.waiting:
            threading.Event().wait(0.005)
        self.gate.set()


def batched(target, slots: int = 8, shape_buckets: bool = False, graphs: bool = False,
            attention: str = "sdpa") -> BatchedEngine:
    """The batched engine; attention "flex" reads the pool in place (on a CPU blocks of 4 positions, so trees and
    chunks straddle blocks, and a small pool: a CPU's eager FlexAttention reads all of it; on CUDA the kernel's
    own block size)."""
    small = {"block_size": 4 if target.device.type == "cpu" else 0, "max_tree_nodes": 31} if attention == "flex" else {}
    return BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=slots, max_context_tokens=512,
                                            shape_buckets=shape_buckets, graphs=graphs, attention=attention, **small))


def run_session(target, scheduler, seed: int, sampling: SamplingSettings, truth: list[int] | None) -> list[int]:
    """Open (a prompt of 3..40 tokens, some with a tree), 8 verifications of random trees, a resume with
    a rollback; the session's committed tokens."""
    rng = random.Random(seed)
    prompt = [rng.randrange(256) for _ in range(rng.randint(3, 40))]
    session = VerifierSession(SessionSettings(f"s{seed}", sampling, seed), target, scheduler, max_context_tokens=400)
    follow = (lambda: truth[len(session.committed) - len(prompt):]) if truth else (lambda: [rng.randrange(300)] * 5)
    session.open(prompt, tree_along(rng, truth or follow(), 300, 5) if seed % 2 else None)
    for step in range(1, 9):
        session.verify(step, len(session.committed), tree_along(rng, follow(), 300, 5))
    confirmed = session.committed[:-3]
    provisional = session.committed[-3:-1] + [rng.randrange(256)]
    session.resume(len(confirmed), committed_hash(confirmed), provisional, ResumePolicy.ROLLBACK)
    session.verify(100, len(session.committed), tree_along(rng, follow(), 300, 5))
    return session.committed[len(prompt):]


def run_all(target, scheduler, sampling: SamplingSettings, truths: dict[int, list[int]] | None,
            together: bool) -> dict[int, list[int]]:
    """Every seed's session, one after the other or all at once on threads (their first forwards in one batch)."""
    seeds = range(6)
    if not together:
        return {s: run_session(target, scheduler, s, sampling, truths and truths[s]) for s in seeds}
    out: dict[int, list[int]] = {}
    held = Held(scheduler, len(seeds))

    def one(seed: int) -> None:
        out[seed] = run_session(target, scheduler, seed, sampling, truths and truths[seed])

    threads = [threading.Thread(target=one, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    held.release()
    for t in threads:
        t.join()
    assert set(out) == set(seeds), "a session thread failed"
    return out


def greedy_truths(target) -> dict[int, list[int]]:
    truths = {}
    for seed in range(6):
        rng = random.Random(seed)
        prompt = [rng.randrange(256) for _ in range(rng.randint(3, 40))]
        truths[seed] = recomputed_greedy(target.model, prompt, 80)
    return truths


@pytest.mark.parametrize("sampling", [SamplingSettings(), SamplingSettings(temperature=0.9, top_p=0.95)],
                         ids=["greedy", "sampling"])
def test_batched_sessions_give_the_tokens_of_sessions_run_alone(target, sampling):
    truths = greedy_truths(target) if sampling.greedy else None
    results = {}
    runs = [("generic", GenericEngine(target), False), ("alone", batched(target), False),
            ("batched", batched(target), True), ("bucketed", batched(target, shape_buckets=True), True),
            ("pool-attention", batched(target, attention="flex"), True)]
    if target.device.type == "cuda":  # a CUDA graph per bucket, replayed
        runs.append(("graphs", batched(target, shape_buckets=True, graphs=True), True))
    for name, engine, together in runs:
        scheduler = ModelScheduler(engine, SMALL_CHUNKS)
        try:
            results[name] = run_all(target, scheduler, sampling, truths, together)
        finally:
            scheduler.close()
        if together:
            assert scheduler.stats.items > scheduler.stats.forwards, "no forward carried two sessions"
    assert results["batched"] == results["bucketed"] == results["alone"] == results["generic"]
    assert results["pool-attention"] == results["batched"]
    assert results.get("graphs", results["batched"]) == results["batched"]
    if truths:  # and greedy verification is the target's own greedy decoding
        for seed, committed in results["batched"].items():
            assert committed == truths[seed][:len(committed)], seed


@pytest.mark.parametrize("sampling", [SamplingSettings(), SamplingSettings(temperature=1.0, top_k=20)],
                         ids=["greedy", "sampling"])
def test_plain_api_batched_gives_the_tokens_of_requests_run_alone(target, sampling):
    requests = [GenerationRequest(tuple(range(5 + 7 * i, 12 + 9 * i)), 12, sampling, seed=i, stop_at_eos=False)
                for i in range(4)]

    def alone(engine) -> list[list[int]]:
        scheduler = ModelScheduler(engine, SMALL_CHUNKS)
        try:
            return [[t.id for t in generate(target, scheduler, r)] for r in requests]
        finally:
            scheduler.close()

    def together(engine) -> list[list[int]]:
        scheduler = ModelScheduler(engine, SMALL_CHUNKS)
        out: list = [None] * len(requests)
        held = Held(scheduler, len(requests))  # every request's prefill queues up, then one batch

        def one(i: int) -> None:
            out[i] = [t.id for t in generate(target, scheduler, requests[i])]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        held.release()
        for t in threads:
            t.join()
        scheduler.close()
        assert scheduler.stats.items > scheduler.stats.forwards
        return out

    reference = alone(GenericEngine(target))
    assert alone(batched(target)) == reference
    assert together(batched(target)) == reference
    assert together(batched(target, shape_buckets=True)) == reference  # padded to power-of-two shapes
    assert together(batched(target, attention="flex")) == reference  # the pool read in place
    if target.device.type == "cuda":
        assert together(batched(target, shape_buckets=True, graphs=True)) == reference  # replayed graphs
    if sampling.greedy:
        for r, got in zip(requests, reference):
            assert got == recomputed_greedy(target.model, list(r.prompt_ids), 12)


def test_a_long_prefill_goes_in_chunks_behind_newer_work(target):
    """A session's verification is answered while another session's long prompt is still being prefilled."""
    scheduler = ModelScheduler(batched(target), SchedulerConfig(prefill_chunk=4))
    try:
        quick = VerifierSession(SessionSettings("quick"), target, scheduler, 400)
        quick.open([1, 2, 3])
        slow = VerifierSession(SessionSettings("slow"), target, scheduler, 400)
        done: list[str] = []
        held = Held(scheduler, 2)
        a = threading.Thread(target=lambda: (slow.open(list(range(100))), done.append("slow")))
        a.start()
        while scheduler.pending() < 1:  # slow's first chunk queues first
            threading.Event().wait(0.005)
        b = threading.Thread(target=lambda: (quick.verify(1, 4, DraftTree((5,), (ROOT,))), done.append("quick")))
        b.start()
        held.release()
        a.join()
        b.join()
        assert done == ["quick", "slow"]
    finally:
        scheduler.close()


def test_pool_keeps_rows_in_place_and_blocks_come_back(target):
    """Blocks are taken as a session grows and given back when it ends; a short pool preempts the idle session
    (recomputed at its next forward) rather than refuse; nothing is reallocated."""
    engine = BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=1, max_context_tokens=40,
                                              max_tree_nodes=7))  # one session's reach: 48 tokens, 3 blocks
    scheduler = ModelScheduler(engine)
    try:
        assert engine.pool.blocks == 3
        address = engine.pool.kv.data_ptr()
        first = VerifierSession(SessionSettings("a"), target, scheduler, 400)
        first.open(list(range(20)))
        assert len(first.kv.blocks) == 2  # 20 positions: 2 blocks of 16
        for step in range(1, 6):
            first.verify(step, len(first.committed), DraftTree((1, 2, 3), (ROOT, 0, ROOT)))
        assert engine.pool.kv.data_ptr() == address  # nothing reallocated
        assert first.kv_bytes == len(first.kv.blocks) * engine.pool.block_bytes
        second = VerifierSession(SessionSettings("b"), target, scheduler, 400)
        second.open(list(range(30)))  # 2 blocks; the first holds 2 of 3 and waits for nothing: it is preempted
        assert engine.preemptions == 1 and first.kv.preempted and not first.kv.blocks
        committed = list(first.committed)
        first.verify(6, len(first.committed), DraftTree((1, 2, 3), (ROOT, 0, ROOT)))  # recomputed; b preempted
        assert engine.preemptions == 2 and not first.kv.preempted and second.kv.preempted
        assert first.committed[:len(committed)] == committed
        del first  # a dropped session's blocks come back to the pool
        second.kv.close()
        assert engine.pool.free == 3
    finally:
        scheduler.close()


@pytest.mark.parametrize("seed", range(20))
def test_batch_masks_equal_the_tree_masks(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 40)
    parents = tuple(rng.choice([ROOT] + list(range(i))) for i in range(n))
    tree = DraftTree(tuple(range(n)), parents)
    past = rng.randint(0, 30)
    work = Work.tree(7, tree, past)
    mask = batch_attention_mask(torch.tensor([work.parents]), torch.tensor([work.positions]), torch.tensor([past]),
                                torch.tensor([len(work)]), past + len(work), torch.float32)
    assert torch.equal(mask, full_attention_mask(tree, past))


def test_batch_masks_of_padded_rows_and_chunk_then_tree():
    tree = DraftTree((5, 6, 7), (ROOT, 0, ROOT))
    chunk_tree = Work.chunk_tree([1, 2, 3], tree, past=2)  # rows 0-2 causal, nodes hang from row 2
    chain = Work.chunk([9, 9], start=4)
    t = len(chunk_tree)
    pad = lambda v, fill: list(v) + [fill] * (t - len(v))  # noqa: E731
    mask = batch_attention_mask(torch.tensor([pad(chunk_tree.parents, -1), pad(chain.parents, -1)]),
                                torch.tensor([pad(chunk_tree.positions, 0), pad(chain.positions, 0)]),
                                torch.tensor([2, 4]), torch.tensor([t, 2]), 12, torch.float32)
    sees = (mask[:, 0] == 0).int().tolist()  # [B, T, 12]
    assert sees[0][2] == [1, 1, 1, 1, 1] + [0] * 7  # the chunk's last row: past 2 + rows 0..2
    assert sees[0][4] == [1, 1, 1, 1, 1, 1, 1] + [0] * 5  # node 1 (row 4): past, rows 0-2, node 0, itself
    assert sees[0][5] == [1, 1, 1, 1, 1, 0, 0, 1] + [0] * 4  # node 2 hangs from row 2 too
    assert sees[1][1] == [1, 1, 1, 1, 1, 1] + [0] * 6  # the chain's second row: past 4 + both rows
    assert sees[1][3] == [1, 1, 1, 1] + [0] * 8  # a padding row sees the past (and key 0, were it empty)


def test_engine_choice_by_architecture_and_device(target):
    assert batched_unsupported(target) is None  # Qwen2, full attention
    assert isinstance(build_engine(target, "generic"), GenericEngine)
    assert isinstance(build_engine(target, "batched", PoolConfig(max_kv_bytes=1 << 30, max_seqs=2,
                                                                 max_context_tokens=64)), BatchedEngine)
    auto = build_engine(target, "auto", PoolConfig(max_kv_bytes=1 << 30, max_seqs=2, max_context_tokens=64))
    assert auto.name == ("generic" if target.device.type == "cpu" else "batched")
    with pytest.raises(ValueError, match="engine"):
        build_engine(target, "paged")
    # Paged KV: any pool that holds one session at the full context runs the batched engine, at every context length
    # (a 32k default context on an H200: tens of thousands of blocks, sessions taking them as they grow)
    assert choose_engine(None, "cuda", 50_000, 2_065)[0] == "batched"
    assert choose_engine(None, "cpu", 50_000, 2_065)[0] == "generic"
    assert choose_engine("sliding window", "cuda", 50_000, 2_065)[0] == "generic"
    kind, why = choose_engine(None, "cuda", 2_000, 2_065)  # not even one full context fits
    assert kind == "generic" and "--gpu-memory-utilization" in why


def test_sliding_window_models_take_the_generic_path(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    from edgespec.shared.models.tiny import tiny_tokenizer

    cfg = MistralConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=16)
    MistralForCausalLM(cfg).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    target = TargetModel(load_model(str(tmp_path), device="cpu", dtype="float32"))
    assert "sliding" in batched_unsupported(target)
    assert build_engine(target, "auto").name == "generic"
    with pytest.raises(ValueError, match="generic"):
        build_engine(target, "batched")


def test_a_server_on_the_batched_engine_serves_sessions_and_evicts_for_blocks(tiny_model_dir):
    """--engine batched: the paged pool is sized from max_kv_bytes (off a GPU); past what its blocks hold, idle
    sessions are evicted (least recently used first) and their prefixes cached in the pool's own blocks, which
    the cache gives back when sessions need them; Resume re-prefills an evicted session; once every session
    and prefix is gone, every block is free."""
    from edgespec.server.app import ServerConfig, start_server

    block = 2 * 2 * 2 * 16 * 16 * 4  # layers x K,V x heads x block tokens x head dim x 4 bytes
    config = ServerConfig(model=str(tiny_model_dir), dtype="float32", device=DEVICES[-1], http_port=None,
                          engine="batched", max_context_tokens=64, max_kv_bytes=25 * block)  # 24 blocks + scratch
    with start_server(config) as handle:
        core = handle.core
        engine = core.scheduler.engine
        assert engine.name == "batched" and engine.pool.blocks == 24 and engine.pool.block_size == 16
        prompts = [[1 + i] + list(range(2, 61)) for i in range(6)]  # 60 tokens: 4 blocks a session
        for i, prompt in enumerate(prompts):
            opened = core.open(SessionSettings(f"s{i}"), prompt)
            assert opened.next_token == recomputed_greedy(core.target.model, prompt, 1)[0]
        assert len(core.store) <= 3 and "s0" not in core.store  # 12 blocks for sessions, the rest headroom
        assert core.prefix_cache is not None and core.prefix_cache.stats.stored >= 1  # evicted sessions' prefixes
        greedy = recomputed_greedy(core.target.model, prompts[0], 4)
        resumed = core.resume("s0", 61, committed_hash(prompts[0] + greedy[:1]), prompts[0] + greedy[:1],
                              greedy[1:3], ResumePolicy.ROLLBACK, SessionSettings("s0"))
        assert not resumed.restored and resumed.agreed == 2 and resumed.next_token == greedy[3]
        for i in range(len(prompts)):
            if f"s{i}" in core.store:
                core.close(f"s{i}")
        while core.prefix_cache.evict_oldest():
            pass
        assert engine.pool.free == engine.pool.blocks


def test_a_refused_work_item_fails_alone(target):
    """Work a session's slot cannot hold is refused before it joins a batch; the batch's others go on."""
    from edgespec.server.errors import InvalidRequestError

    scheduler = ModelScheduler(batched(target))
    try:
        big, small = scheduler.new_kv(), scheduler.new_kv()
        held = Held(scheduler, 2)
        errors, outs = [], []
        too_long = threading.Thread(target=lambda: _catch(errors, lambda: scheduler.run_job(
            scheduler.forward(big, Work.chunk(list(range(2000)), 0)), big)))
        fine = threading.Thread(target=lambda: outs.append(scheduler.run_job(
            scheduler.forward(small, Work.chunk([1, 2, 3], 0)), small)))
        too_long.start()
        fine.start()
        held.release()
        too_long.join()
        fine.join()
        assert isinstance(errors[0], InvalidRequestError) and len(big) == 0
        assert outs[0].logits.shape[0] == 1 and len(small) == 3
    finally:
        scheduler.close()


def _catch(errors: list, fn) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test looks at it
        errors.append(exc)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "phi3", "mistral"])
def test_other_full_attention_architectures_verify_exactly_on_the_pool(arch, tmp_path):
    """The pool's Cache stands in for DynamicCache in each family the batched engine takes (Mistral with its
    window off, as ``architectures`` runs it): greedy trees commit the model's own greedy decoding."""
    import transformers

    from edgespec.server.architectures import adapt_for_tree_verification
    from edgespec.shared.models.tiny import tiny_tokenizer

    names = {"llama": "Llama", "qwen3": "Qwen3", "phi3": "Phi3", "mistral": "Mistral"}
    config_cls = getattr(transformers, f"{names[arch]}Config")
    model_cls = getattr(transformers, f"{names[arch]}ForCausalLM")
    cfg = config_cls(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     initializer_range=0.25, pad_token_id=256, bos_token_id=256, eos_token_id=258)
    torch.manual_seed(0)
    model_cls(cfg).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device=DEVICES[-1], dtype="float32")
    adapt_for_tree_verification(loaded.model, 256)
    target = TargetModel(loaded)
    assert batched_unsupported(target) is None
    truth = recomputed_greedy(target.model, [5, 6, 7, 8], 40)
    for engine in (GenericEngine(target), batched(target), batched(target, attention="flex")):
        scheduler = ModelScheduler(engine)
        try:
            session = VerifierSession(SessionSettings("a"), target, scheduler, 256)
            session.open([5, 6, 7, 8])
            rng = random.Random(1)
            for step in range(1, 8):
                tree = tree_along(rng, truth[len(session.committed) - 4:], 300, 5)
                session.verify(step, len(session.committed), tree)
            assert session.committed[4:] == truth[:len(session.committed) - 4], engine.describe()
        finally:
            scheduler.close()


def test_server_settings_choose_shape_buckets_and_eager(tiny_model_dir):
    """--shape-buckets and --enforce-eager reach the batched engine; unset, buckets follow the device."""
    from edgespec.cli import build_parser
    from edgespec.server.app import ServerConfig, _engine
    from edgespec.server.cli import server_config

    target = TargetModel(load_model(str(tiny_model_dir), device=DEVICES[-1], dtype="float32"))

    def engine_of(*flags: str) -> BatchedEngine:
        args = build_parser().parse_args(["server", str(tiny_model_dir), "--engine", "batched", "--max-context",
                                          "64", "--max-sessions", "2", *flags])
        config: ServerConfig = server_config(args)
        return _engine(config, target, 64)

    cuda = target.device.type == "cuda"
    default = engine_of()
    assert default.config.shape_buckets == cuda and default.config.graphs == cuda
    assert default.runner.kind == ("cuda-graphs" if cuda else "eager")
    forced = engine_of("--shape-buckets", "--enforce-eager")
    assert forced.config.shape_buckets and not forced.config.graphs and forced.runner.kind == "eager"
    assert "shape buckets" in forced.describe()
    assert not engine_of("--no-shape-buckets").config.shape_buckets
