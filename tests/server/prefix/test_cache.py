"""The server's prefix cache on the tiny target, on both engines (generic: DynamicCache; batched: a pool slot).

A conversation's second turn starts with the first turn's prompt and answer: its Open (or plain-API request)
restores that KV and prefills only the rest. Lossless: greedy output with a hit is the target's own greedy
output and the same as without the cache, token for token; seeded sampling draws the same tokens; a Resume that
rebuilds a closed session from the cache stays exact.
"""
from __future__ import annotations

import random

import pytest
import torch
from support.greedy import recomputed_greedy

from edgespec.server.core import CoreLimits, VerifierCore
from edgespec.server.decoder import GenerationRequest, generate
from edgespec.server.engine.batched import BatchedEngine, PoolConfig
from edgespec.server.engine.generic import GenericEngine
from edgespec.server.prefix.cache import PrefixCache
from edgespec.server.scheduler import ModelScheduler
from edgespec.server.session import VerifierSession
from edgespec.shared.wire import ResumePolicy
from edgespec.server.session_store import SessionStore, StoreLimits
from edgespec.server.target import TargetModel
from edgespec.shared.codec import decode_frame
from edgespec.shared.drafters.moa.lsa import LayerSelfAttention, LSAConfig
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.models.loading import load_model
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.session_settings import FeatureRequest, SessionSettings
from edgespec.shared.tree import ROOT, DraftTree, encode_tree
from edgespec.shared.wire import LSA, FeatureKind

CONTEXT = 1024
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module", params=DEVICES)
def target(request, tiny_model_dir) -> TargetModel:
    return TargetModel(load_model(str(tiny_model_dir), device=request.param, dtype="float32"))


def make_engine(kind: str, target: TargetModel):
    if kind == "generic":
        return GenericEngine(target)
    if kind == "pool-attention":  # FlexAttention over the pool; small blocks so prefixes end inside one
        return BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=6, max_context_tokens=CONTEXT,
                                                max_tree_nodes=31, block_size=4 if target.device.type == "cpu" else 0,
                                                attention="flex"))
    return BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=6, max_context_tokens=CONTEXT))


@pytest.fixture(scope="module", params=["generic", "batched"])
def scheduler(request, target):
    s = ModelScheduler(make_engine(request.param, target))
    yield s
    s.close()


@pytest.fixture
def cache() -> PrefixCache:
    return PrefixCache(1 << 30)


@pytest.fixture(scope="module")
def greedy(target):
    return lambda ids, n: recomputed_greedy(target.model, ids, n)


def session(target, scheduler, cache, sampling=SamplingSettings(), seed=0, features=FeatureRequest(),
            lsa=None) -> VerifierSession:
    return VerifierSession(SessionSettings("s", sampling, seed, features), target, scheduler, CONTEXT, cache, lsa)


def guess_chain(truth: list[int], rng: random.Random) -> DraftTree:
    """A chain that follows the target's next tokens for a while, then guesses wrong (or stops)."""
    right = rng.randint(0, min(4, len(truth)))
    tokens = truth[:right] + [rng.randrange(300) for _ in range(rng.randint(0, 2))]
    return DraftTree(tuple(tokens), tuple(ROOT if i == 0 else i - 1 for i in range(len(tokens))))


def converse(s: VerifierSession, prompt: list[int], n: int, greedy, seed: int = 0) -> list[int]:
    """Open, then verify chains that follow the target's greedy text, until n tokens after the prompt."""
    rng = random.Random(seed)
    s.open_cached = s.open(prompt).cached_tokens
    while len(s.committed) < len(prompt) + n:
        s.verify(s.steps, len(s.committed), guess_chain(greedy(s.committed, 4), rng))
    return s.committed[len(prompt):len(prompt) + n]


# ----------------------------------------------------------------- sessions
def test_turn_two_restores_turn_one_and_stays_the_targets_greedy_output(target, scheduler, cache, greedy):
    rng = random.Random(1)
    first = session(target, scheduler, cache)
    converse(first, [rng.randrange(300) for _ in range(21)], 12, greedy)
    assert first.keep_prefix()  # the session closes: its committed KV (all but the last token) is kept
    turn_two = first.committed + [rng.randrange(300) for _ in range(7)]

    hit = session(target, scheduler, cache)
    out = converse(hit, turn_two, 16, greedy, seed=5)
    assert hit.open_cached == len(first.committed) - 1
    miss = session(target, scheduler, None)
    assert converse(miss, turn_two, 16, greedy, seed=5) == out
    assert out == greedy(turn_two, 16)


def test_open_cached_tokens_and_a_tree_sent_with_a_hit(target, scheduler, cache, greedy):
    prompt = list(range(40, 70))
    s = session(target, scheduler, cache)
    s.open(prompt)
    s.keep_prefix()
    again = prompt[:25] + [7, 8, 9]  # shares 25 tokens with the cached prompt
    truth = greedy(again, 4)
    tree = DraftTree((truth[0], truth[1], 5), (ROOT, 0, ROOT))
    hit = session(target, scheduler, cache)
    result = hit.open(again, tree)
    assert result.cached_tokens == 25
    assert result.accepted == (0, 1) and result.next_token == truth[2]
    assert hit.committed == again + truth[:3]
    assert len(hit.kv) == len(hit.committed) - 1
    # The whole prompt cached already: still the last prompt token is fed, for the first token's logits.
    s2 = session(target, scheduler, cache)
    assert s2.open(prompt).cached_tokens == len(prompt) - 1
    assert s2.committed[-1] == greedy(prompt, 1)[0]


def test_seeded_sampling_draws_the_same_tokens_with_and_without_a_hit(target, scheduler, cache):
    sampling = SamplingSettings(temperature=1.0, top_k=40)
    prompt = list(range(100, 140))
    warm = session(target, scheduler, cache, sampling, seed=3)
    warm.open(prompt[:30])
    warm.keep_prefix()

    def sample(prefix_cache) -> tuple[list[int], int]:
        s = session(target, scheduler, prefix_cache, sampling, seed=11)
        cached = s.open(prompt).cached_tokens
        rng = random.Random(2)
        for step in range(6):
            tokens = [rng.randrange(300) for _ in range(3)]
            s.verify(step, len(s.committed), DraftTree(tuple(tokens), (ROOT, 0, ROOT)))
        return s.committed, cached

    with_hit, cached = sample(cache)
    without, _ = sample(None)
    assert cached == 30 and with_hit == without  # Open kept the whole prompt (first token not fed)


def test_moa_features_of_a_hit_cover_the_whole_prompt(target, scheduler, cache):
    lsa = LayerSelfAttention(LSAConfig(target.num_layers, target.kv_size)).eval()
    features = FeatureRequest(FeatureKind.MOA, tli_layers=1)
    prompt = list(range(10, 50))
    s = session(target, scheduler, cache, features=features, lsa=lsa)
    s.open(prompt[:32])
    s.keep_prefix()
    hit = session(target, scheduler, cache, features=features, lsa=lsa).open(prompt)
    miss = session(target, scheduler, None, features=features, lsa=lsa).open(prompt)
    assert hit.cached_tokens == 32 and miss.cached_tokens == 0
    a, b = dict(hit.features), dict(miss.features)
    assert a.keys() == b.keys()
    lsa_hit, lsa_miss = decode_frame(a[LSA]), decode_frame(b[LSA])
    assert lsa_hit.shape == lsa_miss.shape == (len(prompt), 2 * target.kv_size)
    torch.testing.assert_close(lsa_hit, lsa_miss, atol=0.05, rtol=0.05)  # int8 frames of the same rows


def test_last_hidden_sessions_neither_read_nor_feed_the_cache(target, scheduler, cache):
    hidden = FeatureRequest(FeatureKind.LAST_HIDDEN)
    prompt = list(range(60, 90))
    plain = session(target, scheduler, cache)
    plain.open(prompt)
    plain.keep_prefix()
    s = session(target, scheduler, cache, features=hidden)
    result = s.open(prompt + [1, 2])
    assert result.cached_tokens == 0  # Open's features cover every prompt row: a restored prefix has none
    assert decode_frame(dict(result.features)["hidden"]).shape[0] == len(prompt) + 2
    assert not s.keep_prefix()


# ---------------------------------------------------------------- plain API
def test_plain_api_turn_two_restores_turn_one(target, scheduler, cache, greedy):
    prompt = list(range(200, 230))
    first = [t.id for t in generate(target, scheduler, GenerationRequest(tuple(prompt), 10, stop_at_eos=False), cache)]
    assert len(cache) == 1
    turn_two = tuple(prompt + first + [3, 4, 5])
    steps = list(generate(target, scheduler, GenerationRequest(turn_two, 12, stop_at_eos=False), cache))
    assert {t.cached_tokens for t in steps} == {len(prompt) + len(first) - 1}  # the last token was never fed
    plain = [t.id for t in generate(target, scheduler, GenerationRequest(turn_two, 12, stop_at_eos=False))]
    assert [t.id for t in steps] == plain == greedy(list(turn_two), 12)
    # A generation its caller leaves early keeps what it computed: a later request on it hits.
    gen = generate(target, scheduler, GenerationRequest((9, 8, 7, 6, 5), 10, stop_at_eos=False), cache)
    left = [next(gen).id, next(gen).id]
    gen.close()
    again = list(generate(target, scheduler, GenerationRequest((9, 8, 7, 6, 5, *left), 1, stop_at_eos=False), cache))
    assert again[0].cached_tokens == 6


def test_plain_api_seeded_sampling_is_the_same_with_a_hit(target, scheduler, cache):
    prompt = tuple(range(30, 60))
    request = GenerationRequest(prompt, 12, SamplingSettings(temperature=1.0, top_k=50), seed=17, stop_at_eos=False)
    list(generate(target, scheduler, GenerationRequest(prompt[:20], 1, stop_at_eos=False), cache))
    hit = list(generate(target, scheduler, request, cache))
    assert hit[0].cached_tokens == 20
    assert [t.id for t in hit] == [t.id for t in generate(target, scheduler, request)]


# ------------------------------------------------------ the cache's budget
def test_least_recently_used_prefixes_go_first_past_the_budget(target, scheduler):
    def ask(cache, prompt):  # one token: the KV then holds the whole prompt, and the generation keeps it
        return list(generate(target, scheduler, GenerationRequest(tuple(prompt), 1, stop_at_eos=False), cache))

    one = PrefixCache(1 << 30)
    ask(one, range(1, 31))
    size = one.nbytes  # what 30 tokens of KV take in this engine's snapshot
    cache = PrefixCache(int(size * 2.5))
    for start in (1, 2, 3):  # three prompts of 31 tokens: two fit
        ask(cache, range(start, start + 31))
    assert len(cache) == 2 and cache.stats.evicted == 1 and cache.nbytes <= cache.max_bytes

    def hits(start):  # a look-up alone (it stores nothing)
        kv = scheduler.new_kv()
        try:
            return cache.restore(kv, list(range(start, start + 40)), 39)
        finally:
            kv.close()

    assert (hits(1), hits(3), hits(2)) == (0, 31, 31)  # the oldest went; 2.. is now the most recently used
    ask(cache, range(4, 35))
    assert (hits(3), hits(2), hits(4)) == (0, 31, 31)  # least recently used, not first stored, went next


def test_dropped_sessions_are_handed_over_outside_the_lock():
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    class Held:
        def __init__(self, sid):
            import threading
            self.id, self.lock, self.last_used, self.kv_bytes = sid, threading.Lock(), 0.0, 10

    released = []
    clock = Clock()
    store = SessionStore(StoreLimits(ttl_s=5), clock, on_release=lambda s: released.append((s.id, store.expire())))
    store.add(Held("a"))
    clock.now = 10
    assert store.expire() == 1
    assert released == [("a", 0)]  # on_release ran where the store could be called again (not under its lock)


# ------------------------------------------------------------------- core
@pytest.mark.parametrize("engine_kind", ["generic", "batched", "pool-attention"])
def test_close_feeds_the_cache_and_a_resume_rebuilds_from_it_exactly(target, greedy, engine_kind):
    core = VerifierCore(target, CoreLimits(max_context_tokens=CONTEXT, prefix_cache_bytes=1 << 30),
                        engine=make_engine(engine_kind, target))
    try:
        settings = SessionSettings("conv")
        prompt = list(range(5, 35))
        truth = greedy(prompt, 12)
        core.open(settings, prompt)
        core.verify("conv", 0, len(prompt) + 1, encode_tree(DraftTree(tuple(truth[1:5]), (ROOT, 0, 1, 2))))
        committed = prompt + truth[:6]
        core.close("conv")
        assert len(core.prefix_cache) == 1
        # The client comes back after its session was closed (or dropped): Resume rebuilds it from the cache.
        provisional = truth[6:9]
        result = core.resume("conv", len(committed), committed_hash(committed), committed, provisional,
                             ResumePolicy.ROLLBACK, settings)
        assert not result.restored and result.agreed == 3 and result.next_token == truth[9]
        assert core.prefix_cache.stats.hits == len(committed) - 1
        page = core.metrics.render().decode()
        assert f"edgespec:prefix_cache_hits_total{{engine=\"0\",model_name=\"{target.name}\"}} " \
               f"{float(len(committed) - 1)}" in page
        assert "edgespec:prefix_cache_queries_total" in page
    finally:
        core.close_all()


def test_a_restored_prefix_shares_blocks_and_a_rollback_into_them_copies_first(target, greedy):
    """On the paged pool a cached prefix holds the session's full blocks by reference and the next session's table
    starts with those very blocks (a partial last block is its own copy); a rollback into a shared block makes it
    private before anything is written there, so the cached prefix stays what it was: a third session restoring
    it still produces the target's greedy tokens. Blocks all come back at the end."""
    engine = BatchedEngine(target, PoolConfig(max_kv_bytes=1 << 40, max_seqs=4, max_context_tokens=256,
                                              max_tree_nodes=15, block_size=4))
    pool, scheduler, cache = engine.pool, ModelScheduler(engine), PrefixCache(1 << 30)
    try:
        prompt = list(range(5, 31))  # 26 tokens, all in the KV after Open: six full blocks of 4 and one partial
        first = session(target, scheduler, cache)
        first.open(prompt)
        blocks = list(first.kv.blocks)
        assert first.keep_prefix()
        assert all(pool.refs[b] == 2 for b in blocks[:6])  # the session's and the cache's
        first.kv.close()
        assert all(pool.refs[b] == 1 for b in blocks[:6]) and pool.refs[blocks[6]] == 0  # the partial one: copied

        second = session(target, scheduler, cache)
        assert second.open(prompt + [40, 41]).cached_tokens == 26
        assert second.kv.blocks[:6] == blocks[:6] and pool.refs[second.kv.blocks[6]] == 1  # shared, then its own
        assert all(pool.refs[b] == 2 for b in blocks[:6])
        second.kv.crop(10)  # a rollback into block 2, shared: it becomes the session's own copy
        assert second.kv.blocks[:2] == blocks[:2] and second.kv.blocks[2] != blocks[2] and len(second.kv.blocks) == 3
        assert pool.refs[blocks[2]] == 1 and all(pool.refs[b] == 1 for b in blocks[3:6])
        second.committed = second.committed[:11]
        second.verify(second.steps, len(second.committed), DraftTree((1, 2, 3), (ROOT, 0, 1)))  # writes after 10

        third = session(target, scheduler, cache)
        out = converse(third, prompt + [40, 41], 8, greedy)
        assert third.open_cached == 26 and out == greedy(prompt + [40, 41], 8)
        for s in (second, third):
            s.kv.close()
        while cache.evict_oldest():
            pass
        assert pool.free == pool.blocks
    finally:
        scheduler.close()


def test_no_cache_when_the_budget_is_zero(target):
    core = VerifierCore(target, CoreLimits(max_context_tokens=CONTEXT, prefix_cache_bytes=0))
    try:
        assert core.prefix_cache is None
        assert core.open(SessionSettings("x"), list(range(20))).cached_tokens == 0
        core.close("x")
        assert core.open(SessionSettings("y"), list(range(20))).cached_tokens == 0
    finally:
        core.close_all()
