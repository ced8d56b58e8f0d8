"""Beagle on the tiny target: both training stages lower the loss, the drafting runtime computes
exactly what training's chain unroll computes (trees, offline mode, rollback, resume), the
checkpoint round-trips and is refused for another target, and the CLI trains it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from support.drafters import train_config
from edgespec.server.training.fit import build_recipe
from edgespec.server.training.trainer import Trainer
from edgespec.shared.tree import ROOT

pytestmark = pytest.mark.slow  # trains drafters


def beagle(target, store, vocab=0, init=None, **opts):
    return build_recipe("beagle", target.model, store, width=32, heads=4, vocab=vocab, special_ids=(258,),
                        options={k: str(v) for k, v in opts.items()}, init=init)


@pytest.fixture(scope="module")
def early_run(target, store, tmp_path_factory):
    run = tmp_path_factory.mktemp("beagle-early")
    trainer = Trainer(beagle(target, store, block=3), store, run, train_config())
    before = trainer.validate()["val/loss"]
    trainer.fit()
    return run, trainer, before


def test_early_stage_lowers_the_loss(early_run):
    _, trainer, before = early_run
    after = trainer.validate()["val/loss"]
    assert after < 0.9 * before, (before, after)
    train = [r["loss"] for r in trainer.history]
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5


def test_late_stage_starts_from_the_early_run_and_lowers_its_loss(early_run, target, store, tmp_path):
    run, early, _ = early_run
    rec = beagle(target, store, init=run, stage="late", block=3)
    for k, v in early.recipe.head.state_dict().items():  # --init loaded the early stage's weights
        torch.testing.assert_close(rec.head.state_dict()[k], v)
    trainer = Trainer(rec, store, tmp_path, train_config(steps=15, lr=1e-3))
    before = trainer.validate()["val/loss"]
    trainer.fit()
    after = trainer.validate()["val/loss"]
    assert after < before, (before, after)
    assert trainer.history[-1]["val/chains"] > 0


def test_late_stage_keys_do_not_grow_with_the_steps(target, store, seqs):
    # constant memory: every simulated step attends to [target ; previous step] = 2n keys
    from edgespec.shared.drafters.beagle import model

    seen = []
    real = model.CrossBlock.forward

    def spy(self, x, positions, memory, mask):
        seen.append(mask.shape[1])
        return real(self, x, positions, memory, mask)

    model.CrossBlock.forward = spy
    try:
        rec = beagle(target, store, stage="late", block=4)
        rec.forward(seqs[0], 0, 40, torch.Generator().manual_seed(0))
    finally:
        model.CrossBlock.forward = real
    assert seen == [40] + [80] * 3


def test_late_stage_step_i_is_what_drafting_computes_at_depth_i(early_run, drafter, target, store, seqs):
    # on a block rooted at c_b, simulated step m + 1 at place m = the runtime's draft chain of depth m
    # (teacher-forced tokens: on an accepted chain the drafted tokens are the data's)
    k, seq = 4, seqs[0]
    rec = beagle(target, store, stage="late", block=k, noise=0)
    rec.head.load_state_dict(drafter.head.state_dict())
    rec.head.eval()
    with torch.no_grad():
        out = rec.forward(seq, 0, 40, torch.Generator().manual_seed(5))
    offset = int(torch.randint(k, (1,), generator=torch.Generator().manual_seed(5)))
    b = offset + k * 2
    drafter.reset()
    drafter.commit(seq.tokens[:b + 1].tolist(), seq.hidden[:b])
    want = [drafter.root_logprobs()]
    for m in range(1, k):
        want.append(drafter.expand([int(seq.tokens[b + m])], [ROOT if m == 1 else m - 2])[0])
    for m in range(k):
        pred, _, rows = out["steps"][m]
        got = torch.log_softmax(rec.parts.logits(pred[(rows == b + m).nonzero()[0, 0]]), -1)
        torch.testing.assert_close(got, want[m], atol=1e-4, rtol=1e-4)


def test_recipe_options_and_init_are_checked(early_run, target, store, tmp_path):
    from edgespec.server.training.recipes import RecipeOptionError
    from edgespec.shared.drafters.eagle.model import EagleConfig, EagleHead

    with pytest.raises(RecipeOptionError, match="stages are early and late"):
        beagle(target, store, stage="middle")
    with pytest.raises(RecipeOptionError, match="has no option unroll"):
        beagle(target, store, unroll=3)
    with pytest.raises(RecipeOptionError, match="checkpoint.pt"):
        beagle(target, store, init="/nonexistent-run", stage="late")
    torch.save({"modules": {"head": EagleHead(EagleConfig(64, width=32, heads=4)).state_dict()}},
               tmp_path / "checkpoint.pt")
    with pytest.raises(RecipeOptionError, match="no Beagle drafter"):
        beagle(target, store, init=tmp_path, stage="late")
    # a drafter file starts a late stage too, with its own sizes
    early = early_run[1].recipe
    file = early.save_drafter(tmp_path / "file")[0]
    rec = build_recipe("beagle", target.model, store, options={"stage": "late"}, init=file)
    assert rec.head.config == early.head.config


@pytest.fixture(scope="module")
def drafter(early_run, target):
    from edgespec.client.drafters.learned.beagle_runtime import BeagleRuntime
    from edgespec.client.drafters.learned.loading import open_runtime

    run, trainer, _ = early_run
    trainer.recipe.save_drafter(run)
    d = open_runtime(run, target.model)
    assert isinstance(d, BeagleRuntime)
    return d


def chains(drafter, seq, depth):
    from edgespec.server.training.beagle_recipe import draft_chains

    n = seq.tokens.shape[0]
    with torch.no_grad():
        return draft_chains(drafter.head, drafter.parts, seq.tokens, seq.hidden, torch.arange(n), depth)


def test_runtime_drafts_what_training_validates(drafter, seqs):
    # a chain grown node by node in the runtime = the chain unroll training measures acceptance with
    seq = seqs[0]
    want = chains(drafter, seq, 4)
    for root in (3, 10, 25):
        drafter.reset()
        drafter.commit(seq.tokens[:root + 1].tolist(), seq.hidden[:root])
        lp = drafter.root_logprobs()
        got = []
        for step in range(4):
            tok = int(lp.argmax()) if step == 0 else int(lp[0].argmax())
            got.append(tok)
            lp = drafter.expand([tok], [ROOT if step == 0 else step - 1])
        assert got == [int(want[s][1][root]) for s in range(4)]


def test_siblings_do_not_see_each_other_and_batched_expand_equals_one_by_one(drafter, seqs):
    seq = seqs[1]
    drafter.reset()
    drafter.commit(seq.tokens[:20].tolist(), seq.hidden[:19])
    a, b = drafter.root_logprobs().topk(2).indices.tolist()
    batched = drafter.expand([a, b], [ROOT, ROOT])
    grand = drafter.expand([7, 9, 11], [0, 1, 2])  # children of both, and a chain inside one call
    drafter.clear_draft()
    alone_b = drafter.expand([b], [ROOT])
    drafter.clear_draft()
    alone_a = drafter.expand([a], [ROOT])
    child_a = drafter.expand([7], [0])
    grandchild = drafter.expand([11], [1])
    torch.testing.assert_close(batched[1], alone_b[0])
    torch.testing.assert_close(batched[0], alone_a[0])
    torch.testing.assert_close(grand[0], child_a[0])
    torch.testing.assert_close(grand[2], grandchild[0])
    assert not torch.allclose(batched[0], batched[1])


def test_offline_commit_uses_the_predicted_state_and_rollback_restores(drafter, seqs):
    seq = seqs[0]
    drafter.reset()
    drafter.commit(seq.tokens[:16].tolist(), seq.hidden[:15])
    root = drafter.root_logprobs().clone()
    tok = int(root.argmax())
    drafted = drafter.expand([tok], [ROOT])[0]
    drafter.commit([tok], None)  # offline: the root's predicted state stands in for the target's
    assert drafter.length == 17 and drafter.covered == 16
    torch.testing.assert_close(drafter.root_logprobs(), drafted)
    drafter.rollback(16)
    torch.testing.assert_close(drafter.root_logprobs(), root)
    # resume: the target's states replace the predicted one from position 15 on
    drafter.commit(seq.tokens[16:18].tolist(), None)
    drafter.commit([], seq.hidden[15:17], features_from=15)
    fresh = type(drafter)(drafter.head, drafter.parts)
    fresh.commit(seq.tokens[:18].tolist(), seq.hidden[:17])
    torch.testing.assert_close(drafter.root_logprobs(), fresh.root_logprobs())


def test_runtime_refuses_what_its_state_does_not_allow(drafter, seqs):
    from edgespec.client.drafters.learned.runtime import DrafterStateError

    seq = seqs[0]
    drafter.reset()
    with pytest.raises(DrafterStateError, match="at least one token"):
        drafter.commit(seq.tokens[:3].tolist(), None)
    drafter.reset()
    with pytest.raises(DrafterStateError, match="expected features of 4"):
        drafter.commit(seq.tokens[:5].tolist(), seq.hidden[:3])
    with pytest.raises(DrafterStateError, match="'hidden'"):
        drafter.commit(seq.tokens[:5].tolist(), {"lsa": seq.hidden[:4]})


def test_checkpoint_round_trips_and_another_target_is_refused(early_run, target, store, tmp_path):
    from edgespec.shared.drafters.beagle.model import load_beagle
    from edgespec.client.drafters.learned.loading import open_runtime
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError, checkpoint_kind
    from edgespec.shared.models.tiny import TinyConfig, tiny_model

    rec = beagle(target, store, vocab=64)
    path = rec.save_drafter(tmp_path)[0]
    assert path.name == "beagle.safetensors" and checkpoint_kind(tmp_path) == checkpoint_kind(path) == "beagle"
    head, ids = load_beagle(path)
    assert ids.tolist() == rec.parts.vocab_ids.tolist() and head.config == rec.head.config
    d = open_runtime(path, target.model)
    assert d.parts.draft_vocab_size == 64
    with pytest.raises(DrafterCheckpointError, match="hidden_size"):
        open_runtime(path, tiny_model(TinyConfig(hidden_size=32)))
    from edgespec.shared.drafters.eagle.model import load_eagle

    with pytest.raises(DrafterCheckpointError, match="'beagle' drafter, not 'eagle'"):
        load_eagle(path)


def test_cli_trains_both_stages(target_dir, store, tmp_path):
    base = [sys.executable, "-m", "edgespec", "train", "fit", "--kind", "beagle", "--target",
            str(target_dir), "--features", str(store.path), "--width", "32", "--heads", "4", "--steps", "5",
            "--batch-tokens", "128", "--eval-every", "5", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    early = subprocess.run(base + ["--out", str(tmp_path / "early"), "--opt", "block=3"], capture_output=True,
                           text=True, timeout=240, env=env)
    assert early.returncode == 0, early.stderr[-2000:]
    late = subprocess.run(base + ["--out", str(tmp_path / "late"), "--opt", "stage=late", "--opt", "block=3",
                                  "--init", str(tmp_path / "early")], capture_output=True, text=True, timeout=240,
                          env=env)
    assert late.returncode == 0, late.stderr[-2000:]
    for run in ("early", "late"):
        assert (tmp_path / run / "beagle.safetensors").is_file()
        assert "val/accept@1" in (tmp_path / run / "log.txt").read_text()
    import json

    card = json.loads((tmp_path / "late" / "card.json").read_text())
    assert card["kind"] == "beagle" and card["recipe"] == "beagle"


def test_an_lm_head_router_plugs_into_the_beagle_runtime(drafter, seqs):
    router = pytest.importorskip("edgespec.shared.drafters.router")
    parts, seq = drafter.parts, seqs[0]

    def make(n_groups, top_g):
        order, offsets = router.contiguous_groups(parts.draft_vocab_size, n_groups)
        torch.manual_seed(0)
        return router.LMHeadRouter(router.RouterConfig(parts.shape.hidden_size, parts.draft_vocab_size, n_groups,
                                                       top_g, 32, "contiguous"), order, offsets,
                                   parts.vocab_ids).eval()

    drafter.reset()
    drafter.commit(seq.tokens[:12].tolist(), seq.hidden[:11])
    full = drafter.root_logprobs().clone()
    try:
        drafter.attach_router(make(4, 4))  # every group chosen: the full head's answer
        torch.testing.assert_close(drafter.root_logprobs(), full)
        drafter.attach_router(make(8, 1))  # one group of 8: only its tokens can be drafted
        routed = drafter.root_logprobs()
        assert 0 < int(torch.isfinite(routed).sum()) <= parts.draft_vocab_size // 8 + 1
        assert torch.isfinite(drafter.expand([int(routed.argmax())], [ROOT])).sum() < parts.draft_vocab_size
    finally:
        drafter.attach_router(None)
    torch.testing.assert_close(drafter.root_logprobs(), full)
