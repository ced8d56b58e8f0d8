"""eagle+coral on the tiny target: which rows of the unrolled steps are the same position, the
options, a few steps lowering the loss (the alignment term included), and a trained drafter
drafting token-exact through a real server and client."""
from __future__ import annotations

import pytest
import torch
from support.clients import edge_client
from support.drafters import learned_options, train_config
from support.servers import running_server

from edgespec.server.training.coral import aligned_step_features
from edgespec.server.training.fit import build_recipe
from edgespec.server.training.recipes import RecipeOptionError
from edgespec.server.training.trainer import Trainer

pytestmark = pytest.mark.slow  # trains drafters


def recipe(target, store, **kw):
    return build_recipe("eagle+coral", target.model, store, width=32, heads=4, vocab=0, special_ids=(258,), **kw)


def test_aligned_rows_are_the_same_position_at_every_step():
    n, S = 6, 3
    # step s, start r predicts the feature of position r + s: store (step, position) in the row
    steps = [torch.tensor([[s, r + s] for r in range(n)], dtype=torch.float32) for s in range(1, S + 1)]
    w = torch.tensor([10.0, 11, 12, 13, 14, 15])  # w[r]: weight of position r + 1
    feats, wa = aligned_step_features(steps, w)
    for s, f in enumerate(feats, start=1):
        assert f[:, 0].tolist() == [s] * 4 and f[:, 1].tolist() == [3, 4, 5, 6]
    assert wa.tolist() == [12, 13, 14, 15]  # the weights of positions 3..6
    short, _ = aligned_step_features([t[:2] for t in steps], w[:2])
    assert all(f.shape[0] == 0 for f in short)  # no position predicted by all three steps


def test_options_and_refusals(target, store):
    rec = recipe(target, store, options={"temperature": "0.5", "align_weight": "0.3"})
    assert rec.kind == "eagle" and rec.coral.temperature == 0.5 and rec.config.unroll == 3
    assert [(t.name, t.weight) for t in rec.terms] == [("feature", 1.0), ("ce", 0.1), ("align", 0.3)]
    with pytest.raises(RecipeOptionError, match="unroll >= 2"):
        recipe(target, store, options={"unroll": "1"})
    with pytest.raises(RecipeOptionError, match="temperature must be > 0"):
        recipe(target, store, options={"temperature": "0"})
    with pytest.raises(RecipeOptionError, match="no option topk.*temperature"):
        recipe(target, store, options={"topk": "10"})


def test_a_few_steps_lower_the_loss_and_align_the_steps(target, store, tmp_path):
    trainer = Trainer(recipe(target, store), store, tmp_path, train_config())
    before = trainer.validate()["val/loss"]
    trainer.fit()
    after = trainer.validate()["val/loss"]
    assert after < 0.9 * before, (before, after)
    align = [r["loss/align"] for r in trainer.history]
    assert sum(align[-5:]) < 0.9 * sum(align[:5]), align


def test_moa_passes_draft_each_position_at_another_step():
    from edgespec.shared.drafters.blocks import step_bounds

    n, T, offset, passes = 20, 5, 2, 3
    steps = torch.stack([torch.arange(n) - step_bounds(n, T, offset + a) for a in range(passes)])  # [passes, n]
    first = offset + passes - 1  # every pass bounds these positions
    assert bool((step_bounds(n, T, offset + passes - 1)[first:] >= 0).all())
    for p in range(first, n):
        assert len(set(steps[:, p].tolist())) == passes and steps[:, p].min() >= 1 and steps[:, p].max() <= T


def test_moa_coral_lowers_the_loss_and_refuses_one_pass(target, store, tmp_path):
    rec = build_recipe("moa+coral", target.model, store, tli=1, width=32, heads=4, special_ids=(258,))
    assert rec.kind == "moa" and [t.name for t in rec.terms] == ["activation", "kl", "align"]
    trainer = Trainer(rec, store, tmp_path, train_config())
    before = trainer.validate()["val/loss"]
    trainer.fit()
    assert trainer.validate()["val/loss"] < 0.9 * before
    with pytest.raises(RecipeOptionError, match="passes"):
        build_recipe("moa+coral", target.model, store, width=32, heads=4, options={"passes": "1"})


PROMPT = "Write a function that adds two numbers."
# A tree drafted however unsure the little-trained drafter is (the default min_prob stops early).
TREE_KW = dict(branch=3, depth=8, max_nodes=24, min_prob=0.0)


@pytest.fixture(scope="module")
def checkpoint(train_drafter):
    return train_drafter("eagle+coral", steps=100)


def test_trained_drafter_opens_and_drafts_token_exact_over_grpc(target_greedy, checkpoint, target, target_dir):
    from edgespec.client.drafters.learned.eagle_runtime import EagleRuntime
    from edgespec.client.drafters.learned.loading import open_runtime
    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.client.loop.generation import GenerationConfig

    assert isinstance(open_runtime(checkpoint, target.model), EagleRuntime)
    options = learned_options("eagle", checkpoint, target_dir, tree=TreeShape(**TREE_KW))
    with running_server(target_dir, http_port=None) as server, \
            edge_client(server.address, options, target_dir, min_deadline_s=0.5) as client:
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert result.token_ids == target_greedy(target.model, ids, 48)
        assert result.metrics.num_accepted_tokens > 0, "a trained drafter should get some drafts accepted"
        assert result.metrics.calls < 48
