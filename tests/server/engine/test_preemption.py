"""Recompute preemption (vLLM's): when the KV pool runs out, the batched engine gives back the blocks of the session
that ran least recently and re-prefills it from its tokens before its next forward. Three sessions on a pool that
holds two and a half of them verify in turn: every argmax row, accepted path and bonus token is what a pool large
enough gives; sessions were preempted and recomputed; a session whose work waits for a forward is never the one
preempted; and at the end every block is accounted for."""
from __future__ import annotations

import random

import pytest

from edgespec.server.engine.base import Work
from edgespec.server.engine.batched import BatchedEngine, PoolConfig
from edgespec.server.engine.kv import KVPool
from edgespec.server.errors import SessionCapError
from edgespec.server.prefix.kv import take_snapshot
from edgespec.server.target import TargetModel
from edgespec.shared.models.loading import load_model
from edgespec.shared.tree import ROOT, DraftTree

CONTEXT, NODES, BS = 64, 8, 16  # a session reaches 64 + 9 tokens: 5 blocks of 16 (6 with its whole reach)


@pytest.fixture(scope="module")
def target(tiny_model_dir) -> TargetModel:
    return TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32"))


def engine(target, blocks: int) -> BatchedEngine:
    block_bytes = KVPool.bytes_per_block(target.num_layers, target.num_kv_heads, target.head_dim, BS, target.dtype)
    return BatchedEngine(target, PoolConfig(max_kv_bytes=(blocks + 1) * block_bytes, max_seqs=3,
                                            max_context_tokens=CONTEXT, max_tree_nodes=NODES, attention="sdpa"))


def session_steps(eng: BatchedEngine, steps: int = 4) -> list:
    """Three sessions: prompts of 50-55 tokens, then trees verified in turn (each checked, as the scheduler does,
    then run alone). The outputs of every forward, in order."""
    rng = random.Random(0)
    kvs = [eng.new_kv() for _ in range(3)]
    roots, outs = [], []
    for kv in kvs:
        work = Work.chunk([rng.randrange(300) for _ in range(rng.randint(50, 55))], 0)
        eng.check(kv, work)
        (out,) = eng.run([(kv, work)])
        roots.append(out.best[-1])
    for _ in range(steps):
        for i, kv in enumerate(kvs):
            if len(kv) + 1 + NODES > CONTEXT:
                kv.crop(40)  # a rollback keeps the sessions within their reach
            # the target's own next token first in the tree (a probe forward, rolled back), so paths are accepted
            # and compacted, and the tokens a recompute starts from include accepted nodes
            probe = Work.chunk([roots[i]], len(kv))
            eng.check(kv, probe)
            (guess,) = eng.run([(kv, probe)])
            kv.crop(len(kv) - 1)
            tree = DraftTree((guess.best[-1], *(rng.randrange(300) for _ in range(NODES - 1))),
                             (ROOT, 0, 1, 2, ROOT, 4, 0, 6))
            work = Work.tree(roots[i], tree, len(kv), accept=True)
            eng.check(kv, work)
            (out,) = eng.run([(kv, work)])
            outs.append((out.best, out.accepted, out.next_token))
            roots[i] = out.next_token
    eng.held = kvs
    return outs


def test_preempted_sessions_are_recomputed_to_the_same_tokens(target):
    roomy = engine(target, 60)
    want = session_steps(roomy)
    assert roomy.preemptions == 0
    tight = engine(target, 11)  # three sessions of 4 blocks do not fit
    got = session_steps(tight)
    print(f"{tight.preemptions} preemptions over {len(got)} verifications;",
          "accepted lengths", [len(a) for _, a, _ in got])
    assert tight.preemptions >= 3  # every session at least once, in turn
    assert all(len(a) >= 1 for _, a, _ in got)
    assert got == want
    pool = tight.pool
    held = sum(len(kv.blocks) for kv in tight.held)
    assert pool.free + held == pool.blocks  # every block either free or a live session's
    for kv in tight.held:
        kv.close()
    assert pool.free == pool.blocks


def test_a_session_waiting_for_its_forward_is_not_preempted(target):
    eng = engine(target, 12)
    a, b, c = (eng.new_kv() for _ in range(3))
    for kv in (a, b):
        work = Work.chunk(list(range(3, 60)), 0)  # 4 blocks each
        eng.check(kv, work)
        eng.run([(kv, work)])
    tree = DraftTree((5, 6, 7), (ROOT, 0, 0))
    eng.check(b, Work.tree(9, tree, len(b), accept=True))  # b's work waits: b holds 4 blocks and is pinned
    eng.check(c, Work.chunk(list(range(3, 60)), 0))  # c needs 4 of the 4 free: nothing preempted yet
    assert not a.preempted and not b.preempted
    d = eng.new_kv()
    eng.check(d, Work.chunk(list(range(3, 30)), 0))  # 2 more: a (idle, least recent) goes, never b or c (waiting)
    assert a.preempted and not a.blocks and len(a) == 57
    assert not b.preempted and not c.preempted
    with pytest.raises(SessionCapError):  # no prefix snapshot of positions the pool does not hold now
        take_snapshot(a, 16)
    e = eng.new_kv()
    with pytest.raises(SessionCapError):  # every other session waits for a forward: nothing left to preempt
        eng.check(e, Work.chunk(list(range(3, 60)), 0))
    eng.run([(b, Work.tree(9, tree, len(b), accept=True))])
    for kv in (a, b, c, d, e):
        kv.close()
    assert eng.pool.free == eng.pool.blocks


def test_the_last_forwards_sessions_are_kept_until_their_jobs_have_run_on(target):
    """The scheduler resumes a batch's jobs one by one after the forward: the first one's next work must not take
    the blocks of a later one whose job still reads its KV (keeps its accepted rows, exports its K/V features).
    Until ``release_batch`` that work is refused instead; after it, the later session is preempted as usual."""
    eng = engine(target, 12)
    kvs = a, b, c = [eng.new_kv() for _ in range(3)]
    works = [Work.chunk(list(range(3, 60)), 0) for _ in kvs]  # 4 blocks each: the pool's 12 all taken
    for kv, work in zip(kvs, works):
        eng.check(kv, work)
    eng.run(list(zip(kvs, works)))
    more = Work.chunk(list(range(3, 23)), len(a))  # a's next work: to 77 tokens, a fifth block
    with pytest.raises(SessionCapError):
        eng.check(a, more)
    for kv in (b, c):  # their jobs can still read their K/V
        assert not kv.preempted and kv.layer_kv(0, len(kv)).shape[0] == len(kv)  # [T, L, 2*E_kv]
    eng.release_batch()
    eng.check(a, more)
    assert (b.preempted or c.preempted) and eng.preemptions == 1
    eng.run([(a, more)])
    for kv in kvs:
        kv.close()
    assert eng.pool.free == eng.pool.blocks


def test_preemptions_are_exported_as_a_counter(target):
    from edgespec.server.metrics import ServerMetrics

    tight = engine(target, 11)
    metrics = ServerMetrics("tiny", CONTEXT)
    metrics.watch_engine(lambda: tight.times, lambda: tight.preemptions)
    assert metrics.registry.get_sample_value("edgespec_engine_preemptions_total") == 0
    session_steps(tight, steps=2)
    assert tight.preemptions > 0
    assert metrics.registry.get_sample_value("edgespec_engine_preemptions_total") == tight.preemptions
