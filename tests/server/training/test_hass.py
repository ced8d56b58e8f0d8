"""HASS recipes (eagle+hass, moa+hass) on the tiny target: the unrolled masks against the HASS
figure's case written out by hand, unrolled training equal to what the drafter computes while
decoding, detached own features, stages and --init, a few steps lowering the loss, the CLI, and
trained drafters drafting token-exact through a real server and client."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from support.clients import edge_client
from support.drafters import learned_options, train_config
from support.servers import running_server

from edgespec.server.training.fit import build_recipe
from edgespec.server.training.recipes import RecipeOptionError
from edgespec.server.training.trainer import Trainer
from edgespec.shared.drafters.blocks import unrolled_mask

pytestmark = pytest.mark.slow  # trains drafters


def recipe(kind, target, store, tli=0, **kw):
    return build_recipe(kind, target.model, store, tli=tli, width=32, heads=4, vocab=0, special_ids=(258,), **kw)


def position_unrolled_mask(n: int, step: int, device=None) -> torch.Tensor:
    """[n, n * step]: ``unrolled_mask`` re-indexed by position, the way HASS draws it.

    Key block k (1..step) holds the rows of step k by position (block 1: the teacher-forced rows,
    whose features are the target's). The row of step j at position t belongs to the chain
    started at r = t - j + 1: its feature input is the drafter's own, made at step j-1 for
    position t, and it sees the target's rows up to r, the step-k row of position r + k - 1
    for every step 1 < k < j, and itself. Queries at t < j - 1 belong to no chain and see nothing.
    The start-indexed ``unrolled_mask`` is this matrix with the rows of step j shifted by j - 1.
    """
    if step < 1:
        raise ValueError(f"unrolled steps start at 1, got {step}")
    t = torch.arange(n, device=device)[:, None]
    p = torch.arange(n, device=device)[None, :]
    r = t - step + 1  # the chain's start: its last target-feature row
    parts = [(p <= r) & (r >= 0)]
    parts += [(p == r + k - 1) & (r >= 0) for k in range(2, step + 1)]
    return torch.cat(parts, dim=1)


def rows(text: str, blocks: int) -> torch.Tensor:
    """A mask written as lines of `blocks` groups of 0/1 (anything after them is a comment)."""
    lines = text.strip().splitlines()
    return torch.tensor([[c == "1" for c in "".join(line.split()[:blocks])] for line in lines])


# -- masks: the HASS figure's case, n = 3 steps over 5 positions ------------------------------------
# Keys are [step-1 rows (target features) 0..4 | step-2 rows 0..4 | step-3 rows 0..4] by position.
# Step 2, position t: its feature is the drafter's own (made at step 1 from the target's row t-1),
# so it sees the target's rows up to t-1 and itself.
HASS_STEP2 = """
00000 00000   t=0: no chain (no target row before it)
10000 01000   t=1: target row 0, itself
11000 00100
11100 00010
11110 00001
"""
# Step 3, position t: the chain started at t-2: target rows <= t-2, the step-2 row of t-1, itself.
HASS_STEP3 = """
00000 00000 00000
00000 00000 00000
10000 01000 00100   t=2: target row 0, step-2 row 1, itself
11000 00100 00010
11100 00010 00001
"""
# The same step 3 indexed by chain start r (what training computes; row r sits at position r+2):
START_STEP3 = """
10000 10000 10000   r=0: target row 0, its own step-2 row, itself
11000 01000 01000
11100 00100 00100
11110 00010 00010
11111 00001 00001
"""


def test_masks_match_the_hass_figure_written_out_by_hand():
    assert torch.equal(position_unrolled_mask(5, 2), rows(HASS_STEP2, 2))
    assert torch.equal(position_unrolled_mask(5, 3), rows(HASS_STEP3, 3))
    assert torch.equal(unrolled_mask(5, 3), rows(START_STEP3, 3))
    assert torch.equal(position_unrolled_mask(5, 1), torch.ones(5, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize("step", [2, 3, 4])
def test_start_indexed_unroll_is_the_position_indexed_hass_mask(step):
    n = 7
    by_pos, by_start = position_unrolled_mask(n, step), unrolled_mask(n, step)
    for t in range(step - 1, n):
        r = t - step + 1
        for k in range(1, step + 1):
            for p in range(n):
                # key (block k, position p) is the row of step k of start p - k + 1 (block 1: start p)
                start = p - (k - 1) if k > 1 else p
                want = 0 <= start < n and bool(by_start[r, (k - 1) * n + start])
                assert bool(by_pos[t, (k - 1) * n + p]) == want, (t, k, p)


# -- the unrolled forward is what the drafter computes while decoding -------------------------------
def test_unrolled_steps_equal_drafting_on_own_features(target, store, seqs):
    from edgespec.client.drafters.learned.eagle_runtime import EagleRuntime
    from edgespec.server.training.eagle_recipe import unrolled_steps
    from edgespec.shared.tree import ROOT

    rec = recipe("eagle+hass", target, store)
    head, parts = rec.head.eval(), rec.parts
    seq = seqs[0]
    tokens, h = seq.tokens[:24], seq.hidden[:24]
    n = tokens.shape[0] - 1
    with torch.no_grad():
        steps = unrolled_steps(head, parts, tokens, h[:n], torch.arange(n + 1), 3, detach=True, data_tokens=True)
    for m in (4, 11):  # committed c_0..c_m; the root row is start m - 1
        d = EagleRuntime(head, parts)
        d.commit(tokens[:m + 1].tolist(), h[:m])
        got = [d.root_logprobs()]
        got.append(d.expand([int(tokens[m + 1])], [ROOT])[0])  # step 2 reads the data token c_{m+1}
        got.append(d.expand([int(tokens[m + 2])], [0])[0])
        for s in range(3):
            want = torch.log_softmax(parts.logits(steps[s][0][m - 1]).float(), -1)
            torch.testing.assert_close(got[s], want, atol=1e-4, rtol=1e-4)


def test_detached_features_carry_no_gradient_to_the_previous_step(target, store, seqs):
    from edgespec.server.training.eagle_recipe import unrolled_steps

    rec = recipe("eagle+hass", target, store)
    seq = seqs[0]
    tokens, h = seq.tokens[:20], seq.hidden[:20]
    n = tokens.shape[0] - 1
    for detach in (True, False):
        steps = unrolled_steps(rec.head, rec.parts, tokens, h[:n], torch.arange(n + 1), 3, detach=detach,
                               data_tokens=True)
        loss3 = steps[2][0].pow(2).sum()
        g1, g2 = torch.autograd.grad(loss3, [steps[0][0], steps[1][0]], allow_unused=True, retain_graph=True)
        if detach:
            assert g1 is None and g2 is None
            weights = torch.autograd.grad(loss3, rec.head.fc.weight)[0]
            assert float(weights.abs().sum()) > 0  # step 3 still trains the head itself
        else:
            assert float(g2.abs().sum()) > 0 and float(g1.abs().sum()) > 0


def test_moa_detached_own_context_same_forward_no_gradient_across_rows(target, store, seqs):
    from edgespec.server.training.moa_recipe import moa_window
    from edgespec.shared.drafters.blocks import step_bounds

    rec = recipe("moa+hass", target, store, tli=1)
    seq, n = seqs[0], 12
    tokens, kv, pos = seq.tokens[:n], seq.kv[:n].float(), torch.arange(n)
    bounds = step_bounds(n, 5, 1)  # segments [1..5], [6..10], [11]
    act_a, logits_a = moa_window(rec.model, rec.parts, tokens, kv, pos, bounds, detach_own=False)
    act_b, logits_b = moa_window(rec.model, rec.parts, tokens, kv, pos, bounds, detach_own=True)
    torch.testing.assert_close(logits_a, logits_b, atol=1e-5, rtol=1e-5)
    i = 9  # in the segment 6..10: attends to the own TLI K/V of rows 6, 7, 8 and itself
    g_a = torch.autograd.grad(logits_a[i].pow(2).sum(), act_a, retain_graph=True)[0].abs().sum(-1)
    g_b = torch.autograd.grad(logits_b[i].pow(2).sum(), act_b, retain_graph=True)[0].abs().sum(-1)
    assert float(g_b[i]) > 0 and float(g_b[6:9].sum()) == 0.0  # only its own prediction
    assert float(g_a[6:9].sum()) > 0  # without the detach the earlier rows get a gradient
    assert rec.config.detach_own and not recipe("moa", target, store, tli=1).config.detach_own


# -- options, stages, --init --------------------------------------------------------------------------
def test_stage_sets_the_topk_weight_and_stage_two_needs_init(target, store, tmp_path):
    one = recipe("eagle+hass", target, store)
    assert [t.name for t in one.terms] == ["feature", "ce"]
    assert one.config.unroll == 3 and one.config.detach and one.config.data_tokens
    weighted = recipe("eagle+hass", target, store, options={"topk_weight": "0.5", "topk": "4"})
    assert [(t.name, t.weight) for t in weighted.terms][-1] == ("topk", 0.5) and weighted.hass.topk == 4
    with pytest.raises(RecipeOptionError, match="--init"):
        recipe("eagle+hass", target, store, options={"stage": "2"})
    with pytest.raises(RecipeOptionError, match="stages 1"):
        recipe("eagle+hass", target, store, options={"stage": "3"})
    with pytest.raises(RecipeOptionError, match="no option bogus.*topk_weight"):
        recipe("moa+hass", target, store, options={"bogus": "1"})
    with pytest.raises(RecipeOptionError, match="topk_weight=much"):
        recipe("eagle+hass", target, store, options={"topk_weight": "much"})


def test_stage_two_starts_from_the_stage_one_run(target, store, tmp_path):
    first = recipe("eagle+hass", target, store)
    Trainer(first, store, tmp_path / "s1", train_config(steps=3, save_every=3)).fit()
    second = recipe("eagle+hass", target, store, options={"stage": "2"}, init=tmp_path / "s1", seed=5)
    assert ("topk", 1.0) in [(t.name, t.weight) for t in second.terms]
    for k, v in first.head.state_dict().items():
        torch.testing.assert_close(second.head.state_dict()[k], v)
    first.save_drafter(tmp_path / "d")  # a saved drafter works as --init too (bf16: close, not equal)
    from_file = recipe("eagle+hass", target, store, options={"stage": "2"}, init=tmp_path / "d" / "eagle.safetensors")
    torch.testing.assert_close(from_file.head.fc.weight, first.head.fc.weight, atol=1e-2, rtol=1e-2)
    with pytest.raises(RecipeOptionError, match="another kind"):
        recipe("moa+hass", target, store, options={"stage": "2"}, init=tmp_path / "s1")
    with pytest.raises(RecipeOptionError, match="other sizes"):
        build_recipe("eagle+hass", target.model, store, width=64, heads=4, options={"stage": "2"},
                     init=tmp_path / "s1")
    with pytest.raises(RecipeOptionError, match="no such"):
        recipe("eagle+hass", target, store, init=tmp_path / "missing")
    moa = recipe("moa", target, store, tli=1)
    Trainer(moa, store, tmp_path / "m1", train_config(steps=2, save_every=2)).fit()
    moa2 = recipe("moa+hass", target, store, tli=1, options={"stage": "2"}, init=tmp_path / "m1", seed=3)
    for name in ("lsa", "client"):  # the client's activation stats too: stage 1's, not recalibrated
        want = moa.trainable()[name].state_dict()
        for k, v in moa2.trainable()[name].state_dict().items():
            torch.testing.assert_close(v, want[k])


# -- training ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,tli,options", [("eagle+hass", 0, {}), ("eagle+hass", 0, {"topk_weight": "1"}),
                                              ("moa+hass", 1, {"topk_weight": "1"})])
def test_a_few_steps_lower_the_loss(kind, tli, options, target, store, tmp_path):
    trainer = Trainer(recipe(kind, target, store, tli, options=options), store, tmp_path, train_config())
    before = trainer.validate()["val/loss"]
    trainer.fit()
    after = trainer.validate()["val/loss"]
    assert after < 0.9 * before, (before, after)
    if "topk_weight" in options:
        logged = [r["loss/topk"] for r in trainer.history]
        assert sum(logged[-5:]) < sum(logged[:5])


def test_cli_trains_eagle_hass_then_stage_two_and_refuses_an_unknown_option(target_dir, store, tmp_path,
                                                                            edgespec_in_process, capsys):
    base = ["train", "fit", "--target", str(target_dir), "--features", str(store.path), "--width", "32",
            "--heads", "4", "--batch-tokens", "128", "--eval-every", "5"]
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "edgespec", *base, "--threads", "1", "--kind",
                           "eagle+hass", "--out", str(run), "--steps", "5", "--opt", "unroll=3"],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    card = json.loads((run / "card.json").read_text())
    assert card["recipe"] == "eagle+hass" and card["kind"] == "eagle" and (run / "eagle.safetensors").is_file()
    stage2 = tmp_path / "run2"
    assert edgespec_in_process(base + ["--kind", "eagle+hass", "--out", str(stage2), "--steps", "2", "--init", str(run),
                                  "--opt", "stage=2"]) == 0
    assert "loss/topk" in (stage2 / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert edgespec_in_process(base + ["--kind", "eagle+hass", "--out", str(tmp_path / "bad"), "--steps", "1",
                                  "--opt", "tempreature=3"]) == 1
    err = capsys.readouterr().err
    assert "has no option tempreature" in err and "topk_weight" in err


# -- trained drafters in the real system ------------------------------------------------------------------
PROMPT = "Write a function that adds two numbers."
# A tree drafted however unsure the little-trained drafter is (the default min_prob stops early).
TREE_KW = dict(branch=3, depth=8, max_nodes=24, min_prob=0.0)
KINDS = [("eagle+hass", 0), ("moa+hass", 1)]


@pytest.fixture(scope="module")
def checkpoints(train_drafter):
    return {kind: train_drafter(kind, steps=100, tli=tli, options={"topk_weight": "0.5"}) for kind, tli in KINDS}


@pytest.fixture(scope="module")
def server(target_dir, checkpoints):
    with running_server(target_dir, http_port=None, moa_server_parts={"moa-tli1": str(checkpoints["moa+hass"])}) as handle:
        yield handle


@pytest.mark.parametrize("kind,tli", KINDS)
def test_trained_drafter_opens_and_drafts_token_exact_over_grpc(target_greedy, kind, tli, server, target, target_dir, checkpoints):
    from edgespec.client.drafters.learned.loading import open_runtime
    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.client.loop.generation import GenerationConfig

    base = kind.split("+")[0]
    assert type(open_runtime(checkpoints[kind], target.model)).__name__ == ("EagleRuntime" if base == "eagle"
                                                                             else "MoARuntime")
    options = learned_options(base, checkpoints[kind], target_dir, tree=TreeShape(**TREE_KW))
    with edge_client(server.address, options, target_dir, min_deadline_s=0.5) as client:
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert result.token_ids == target_greedy(target.model, ids, 48)
        assert result.metrics.num_accepted_tokens > 0, "a trained drafter should get some drafts accepted"
        assert result.metrics.calls < 48
