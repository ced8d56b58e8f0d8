"""`edgespec train fit --kind NAME --opt KEY=VALUE`: the recipe registry and its refusals."""
import pytest

from edgespec.server.training.fit import build_recipe, parse_opts
from edgespec.server.training.recipes import RecipeOptionError, all_recipes


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
