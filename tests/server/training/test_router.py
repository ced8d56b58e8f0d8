"""CORAL's LM-head router on tiny models: the group split, the routed head, its training target,
the second training stage (router learns, base stays bit-identical), files and refusals."""
from __future__ import annotations

import pytest
import torch

from edgespec.server.training.fit import build_recipe
from edgespec.server.training.losses import Acceptance
from edgespec.server.training.recipes import RecipeOptionError
from edgespec.server.training.router_recipe import _HeadTap
from edgespec.server.training.trainer import TrainConfig, Trainer
from edgespec.shared.drafters.router import (LMHeadRouter, RouterConfig, RouterMismatchError, attach_router_if_present,
                                             bind_router, contiguous_groups, frequency_groups, group_index,
                                             group_probabilities, load_router, restrict_to_groups, save_router)
from edgespec.shared.drafters.target_parts import TargetParts
from edgespec.shared.tree import ROOT


def cfg(**kw) -> TrainConfig:
    base = dict(steps=30, lr=3e-3, warmup=2, batch_tokens=200, window=96, eval_every=1000, eval_depth=4,
                save_every=1000, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def random_router(parts: TargetParts, n_groups=8, top_g=2, split="frequency", seed=0) -> LMHeadRouter:
    v = parts.draft_vocab_size
    gen = torch.Generator().manual_seed(seed)
    if split == "frequency":
        order, offsets = frequency_groups(torch.randint(0, 50, (v,), generator=gen), n_groups)
    else:
        order, offsets = contiguous_groups(v, n_groups)
    torch.manual_seed(seed)
    return LMHeadRouter(RouterConfig(parts.shape.hidden_size, v, n_groups, top_g, 32, split), order, offsets,
                        parts.vocab_ids).eval()


# -- the split -----------------------------------------------------------------------------------
def test_frequency_split_is_a_partition_with_frequent_tokens_first():
    counts = torch.tensor([0, 5, 3, 5, 1, 0, 9])
    order, offsets = frequency_groups(counts, 3)
    assert order.tolist() == [6, 1, 3, 2, 4, 0, 5]  # by count, ties to the lower id
    assert offsets.tolist() == [0, 3, 5, 7]  # sizes 3, 2, 2: differ by at most one
    assert group_index(order, offsets).tolist() == [2, 0, 1, 0, 1, 2, 0]


@pytest.mark.parametrize("vocab,n", [(320, 8), (151936, 32), (10, 10), (11, 3)])
def test_every_token_is_in_exactly_one_group(vocab, n):
    for order, offsets in (frequency_groups(torch.randint(0, 9, (vocab,)), n), contiguous_groups(vocab, n)):
        groups = [order[offsets[g]:offsets[g + 1]].tolist() for g in range(n)]
        flat = sorted(t for g in groups for t in g)
        assert flat == list(range(vocab))
        sizes = [len(g) for g in groups]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_group_probability_target_on_a_hand_example():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]))
    q = group_probabilities(logits, torch.tensor([0, 1, 0, 1]), 2)
    torch.testing.assert_close(q, torch.tensor([[0.4, 0.6], [0.8, 0.2]]))


def test_adjacent_chosen_groups_merge_into_one_head_slice():
    from edgespec.shared.drafters.router import merged_spans

    assert merged_spans([1, 2, 3, 7]) == [(1, 4), (7, 8)]
    assert merged_spans([0]) == [(0, 1)] and merged_spans([]) == []


def test_router_config_refuses_impossible_settings():
    with pytest.raises(ValueError, match="top_g"):
        RouterConfig(64, 320, n_groups=4, top_g=5)
    with pytest.raises(ValueError, match="split"):
        RouterConfig(64, 320, split="random")


# -- the routed head -----------------------------------------------------------------------------
@pytest.mark.parametrize("split", ["frequency", "contiguous"])
def test_routed_logits_equal_the_full_head_on_chosen_groups_and_minus_inf_elsewhere(split, target):
    parts = TargetParts(target.model, dtype=torch.float32)
    router = random_router(parts, split=split)
    hidden = torch.randn(5, parts.shape.hidden_size)
    routed = bind_router(router, parts).logits(hidden)
    full = parts.logits(hidden)
    chosen = router.choose(hidden)
    member = torch.zeros_like(full, dtype=torch.bool)
    group_of = router.group_of()
    for r in range(5):
        for g in chosen[r].tolist():
            member[r] |= group_of == g
    assert member.sum(-1).tolist() == [80] * 5  # 2 of 8 groups of 40 tokens
    torch.testing.assert_close(routed[member], full[member])
    assert torch.isinf(routed[~member]).all() and (routed[~member] < 0).all()
    torch.testing.assert_close(restrict_to_groups(full, chosen, group_of), routed)


def test_all_groups_chosen_drafts_exactly_like_the_full_head(target):
    from edgespec.shared.drafters.eagle.model import EagleConfig, EagleHead
    from edgespec.client.drafters.learned.eagle_runtime import EagleRuntime

    parts = TargetParts(target.model, dtype=torch.float32)
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(parts.shape.hidden_size, width=32, heads=4, mlp_hidden=64))
    plain, routed = EagleRuntime(head, parts), EagleRuntime(head, parts)
    routed.attach_router(random_router(parts, n_groups=4, top_g=4))
    ids = list(range(60, 72))
    for d in (plain, routed):
        d.commit(ids, torch.randn(len(ids) - 1, parts.shape.hidden_size, generator=torch.Generator().manual_seed(1)))
    torch.testing.assert_close(routed.root_logprobs(), plain.root_logprobs())
    torch.testing.assert_close(routed.expand([70, 71], [ROOT, ROOT]), plain.expand([70, 71], [ROOT, ROOT]))
    routed.attach_router(random_router(parts, n_groups=8, top_g=1))
    lp = routed.root_logprobs()
    assert int(torch.isfinite(lp).sum()) == 40  # one group of 40 tokens, renormalised over it
    torch.testing.assert_close(lp.exp().sum(), torch.tensor(1.0))


def test_router_file_round_trip_and_refusal_of_another_vocabulary(target, tmp_path):
    parts = TargetParts(target.model, dtype=torch.float32)
    router = random_router(parts)
    path = save_router(router, tmp_path / "router.safetensors")
    again = load_router(path)
    h = torch.randn(3, parts.shape.hidden_size)
    torch.testing.assert_close(again(h), router(h))
    assert torch.equal(again.order, router.order) and torch.equal(again.offsets, router.offsets)
    reduced = TargetParts(target.model, vocab_ids=torch.arange(0, 320, 2), dtype=torch.float32)
    with pytest.raises(RouterMismatchError, match="draft vocabulary of 320"):
        bind_router(again, reduced)
    same_size = TargetParts(target.model, vocab_ids=torch.arange(320).flip(0), dtype=torch.float32)
    with pytest.raises(RouterMismatchError, match="another draft vocabulary"):
        bind_router(again, same_size)


# -- stage 2 -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stage1(target, store, tmp_path_factory):
    """Run folders of a small eagle and a small moa fit (the bases of the router stage)."""
    out = {}
    for kind in ("eagle", "moa"):
        run = tmp_path_factory.mktemp(f"stage1-{kind}")
        rec = build_recipe(kind, target.model, store, width=32, heads=4, special_ids=(258,))
        Trainer(rec, store, run, cfg(steps=40)).fit()
        rec.save_drafter(run)
        out[kind] = run
    return out


def router_recipe(kind, target, store, init, run_dir=None, **opts):
    options = {"n_groups": "8", "top_g": "2", "router_hidden": "32", **{k: str(v) for k, v in opts.items()}}
    return build_recipe(f"{kind}+router", target.model, store, width=32, heads=4, special_ids=(258,),
                        options=options, init=init, run_dir=run_dir)


def base_state(recipe) -> dict[str, torch.Tensor]:
    b = recipe.base
    modules = {"head": b.head} if b.kind == "eagle" else {"lsa": b.model.lsa, "client": b.model.client}
    return {f"{m}.{k}": v.clone() for m, mod in modules.items() for k, v in mod.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle", "moa"])
def test_stage_two_lowers_the_router_loss_and_leaves_the_base_bit_identical(kind, stage1, target, store, tmp_path):
    rec = router_recipe(kind, target, store, stage1[kind], tmp_path)
    assert rec.kind == kind and list(rec.trainable()) == ["router"]
    before_base = base_state(rec)
    trainer = Trainer(rec, store, tmp_path, cfg(steps=30, lr=1e-2, eval_every=30, save_every=30))
    before = trainer.validate()
    trainer.fit()
    after = trainer.validate()
    assert after["val/loss"] < 0.9 * before["val/loss"], (before["val/loss"], after["val/loss"])
    after_base = base_state(rec)
    assert before_base.keys() == after_base.keys()
    assert all(torch.equal(before_base[k], after_base[k]) for k in before_base)
    logged = trainer.history[-1]
    assert "loss/missed_mass" in logged and 0.0 <= logged["loss/missed_mass"] <= 1.0
    rates = [logged[f"val/accept@{k}"] for k in range(1, 5)]
    assert rates == sorted(rates, reverse=True)
    full = Acceptance(0, [])  # the same drafting with the full head: the same chains are measured
    for path in trainer.val_files:
        with torch.no_grad():
            full = full + rec.base.acceptance(trainer._load(path), 4, _HeadTap(rec.parts))
    assert full.chains == logged["val/chains"] > 0
    files = rec.save_drafter(tmp_path)
    assert files[-1].name == "router.safetensors" and all(f.is_file() for f in files)


@pytest.mark.slow
def test_the_saved_router_attaches_to_the_saved_drafter(stage1, target, store, tmp_path):
    from edgespec.client.drafters.learned.loading import open_runtime
    from edgespec.shared.drafters.checkpoint import find_checkpoint

    rec = router_recipe("eagle", target, store, stage1["eagle"], tmp_path)
    Trainer(rec, store, tmp_path, cfg(steps=3)).fit()
    rec.save_drafter(tmp_path)
    ckpt = find_checkpoint(tmp_path)
    runtime = open_runtime(ckpt, target.model, router=False)  # asked to ignore the router
    assert attach_router_if_present(runtime, ckpt, enabled=False) is None and runtime.routed is None
    router = attach_router_if_present(runtime, ckpt)
    assert router is not None and runtime.routed is not None
    assert open_runtime(ckpt, target.model).routed is not None  # opening attaches it by default
    other = open_runtime(find_checkpoint(stage1["eagle"]), target.model)  # no router beside it
    assert attach_router_if_present(other, find_checkpoint(stage1["eagle"])) is None


@pytest.mark.slow
def test_stage_two_refusals_say_what_to_do(stage1, target, store, tmp_path):
    with pytest.raises(RecipeOptionError, match="--init"):
        router_recipe("eagle", target, store, None)
    with pytest.raises(RecipeOptionError, match="own --out"):
        router_recipe("eagle", target, store, stage1["eagle"], run_dir=stage1["eagle"])
    with pytest.raises(RecipeOptionError, match="no option"):
        router_recipe("eagle", target, store, stage1["eagle"], nonsense=1)
    with pytest.raises(RecipeOptionError, match="top_g"):
        router_recipe("eagle", target, store, stage1["eagle"], top_g=9)
    with pytest.raises(RecipeOptionError, match="not the base drafter's 'head'"):
        router_recipe("eagle", target, store, stage1["moa"])
