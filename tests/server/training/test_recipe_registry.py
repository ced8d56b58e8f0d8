"""`edgespec train fit --kind NAME --opt KEY=VALUE`: the recipe registry and its refusals."""
import pytest
import torch
from support.drafters import train_config

from edgespec.server.training.fit import build_recipe, parse_opts
from edgespec.server.training.recipes import RecipeOptionError, all_recipes
from edgespec.server.training.trainer import Trainer


def test_base_recipes_are_registered():
    names = all_recipes()
    assert {"eagle", "moa"} <= set(names)
    assert all(isinstance(help_text, str) and help_text for _, help_text in names.values())


def test_opt_values_reach_the_recipe_config_typed(target, store):
    recipe = build_recipe("eagle", target.model, store, width=32, heads=4, options={"unroll": "3", "noise": "0.2"})
    assert recipe.config.unroll == 3 and recipe.config.noise == pytest.approx(0.2)
    assert recipe.recipe_name == "eagle" and recipe.kind == "eagle"
    moa = build_recipe("moa", target.model, store, width=32, heads=4, options={"min_T": "3", "max_T": "4"})
    assert (moa.config.min_T, moa.config.max_T) == (3, 4)


def test_unknown_recipe_key_or_type_is_refused_with_what_is_valid(target, store):
    with pytest.raises(RecipeOptionError, match=r"no training recipe 'egle' \(known: .*eagle"):
        build_recipe("egle", target.model, store, width=32, heads=4)
    with pytest.raises(RecipeOptionError, match=r"no option unrol .*it takes: .*unroll"):
        build_recipe("eagle", target.model, store, width=32, heads=4, options={"unrol": "3"})
    with pytest.raises(RecipeOptionError, match="is of type int"):
        build_recipe("eagle", target.model, store, width=32, heads=4, options={"unroll": "three"})


def test_parse_opts():
    assert parse_opts(["a=1", "b = x", "a=2"]) == {"a": "2", "b": "x"}
    with pytest.raises(RecipeOptionError, match="KEY=VALUE"):
        parse_opts(["novalue"])


def test_base_recipes_start_from_init_a_run_or_a_saved_drafter(target, store, tmp_path):
    """--init on plain eagle / moa: a warm start from a run folder or a shipped drafter, never ignored."""
    for kind, tli in (("eagle", 0), ("moa", 1)):
        first = build_recipe(kind, target.model, store, tli=tli, width=32, heads=4, seed=1)
        Trainer(first, store, tmp_path / kind, train_config(steps=2, save_every=2)).fit()
        first.save_drafter(tmp_path / f"{kind}-saved")
        cold = build_recipe(kind, target.model, store, tli=tli, width=32, heads=4, seed=5)
        warm = build_recipe(kind, target.model, store, tli=tli, width=32, heads=4, seed=5, init=tmp_path / kind)
        saved = tmp_path / f"{kind}-saved" / ("eagle.safetensors" if kind == "eagle" else "")
        from_file = build_recipe(kind, target.model, store, tli=tli, width=32, heads=4, seed=5, init=saved)
        for name, module in first.trainable().items():
            for key, value in module.state_dict().items():
                torch.testing.assert_close(warm.trainable()[name].state_dict()[key], value)
                # a saved drafter's layers are bf16: close to the run's, not equal
                torch.testing.assert_close(from_file.trainable()[name].state_dict()[key].float(), value.float(),
                                           atol=2e-2, rtol=2e-2)
        differs = [not torch.equal(v, cold.trainable()[name].state_dict()[k])
                   for name, module in first.trainable().items() for k, v in module.state_dict().items()]
        assert any(differs), f"{kind}: a cold start equals the trained run, so the checks above prove nothing"
    with pytest.raises(RecipeOptionError, match="another kind"):
        build_recipe("eagle", target.model, store, width=32, heads=4, init=tmp_path / "moa")
    with pytest.raises(RecipeOptionError, match="other sizes"):
        build_recipe("eagle", target.model, store, width=64, heads=4, init=tmp_path / "eagle")
