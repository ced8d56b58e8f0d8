"""Training recipes by name: what ``edgespec train fit --kind NAME`` can train.

A recipe module exposes ``RECIPES = {name: (builder, help)}``; a builder turns a
``RecipeContext`` (the feature store, the target's frozen parts, sizes, ``--opt``
overrides, an optional ``--init`` run to start from) into a ``Recipe``. Base
recipes (``eagle``, ``moa``) live here; the alignment recipes (HASS, CORAL), the
LM-head router and Beagle register from their own modules, listed in
``RECIPE_MODULES``. Names compose with ``+`` where the papers compose them
(``eagle+hass``): the module of the suffix registers the composed name.
"""
from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from edgespec.shared.errors import EdgespecError
from edgespec.shared.drafters.eagle.model import EagleConfig, EagleHead
from edgespec.shared.drafters.moa.client_part import MoAConfig
from edgespec.shared.drafters.moa.model import new_moa
from edgespec.shared.drafters.target_parts import TargetParts, load_target_parts
from .eagle_recipe import EagleRecipe, EagleRecipeConfig
from .features import FeatureStore
from .moa_recipe import MoARecipe, MoARecipeConfig


class RecipeOptionError(EdgespecError, ValueError, grpc_code="INVALID_ARGUMENT"):
    """An unknown recipe, an ``--opt`` key the recipe does not have, or a value of the wrong type."""


@dataclass
class RecipeContext:
    """Everything a recipe builder may need; builders read what they use."""

    kind: str  # the recipe name asked for (e.g. "eagle+hass")
    store: FeatureStore  # the feature store to train on
    target: object  # registry name / folder of the target, or a loaded HF model (tests)
    tli: int = 0  # MoA: target layers run on the client
    sizes: dict = field(default_factory=dict)  # drafter sizes given on the command line (width, heads, mlp_hidden)
    vocab_ids: torch.Tensor | None = None  # reduced draft vocabulary (target ids) or None
    options: dict[str, str] = field(default_factory=dict)  # --opt KEY=VALUE, applied to the recipe's config
    init: Path | None = None  # --init: a run folder or drafter file to start from (second stages)
    run_dir: Path | None = None
    _parts: dict = field(default_factory=dict, repr=False)
    _used: set = field(default_factory=set, repr=False)  # --opt keys some config read
    _classes: list = field(default_factory=list, repr=False)  # the config classes asked for

    def parts(self, tli: int = 0) -> TargetParts:
        """The target's frozen parts (embedding, norm, LM head, last ``tli`` layers), loaded once."""
        if tli not in self._parts:
            if isinstance(self.target, (str, Path)):
                self._parts[tli] = load_target_parts(str(self.target), tli, self.vocab_ids, torch.float32)
            else:
                self._parts[tli] = TargetParts(self.target, tli=tli, vocab_ids=self.vocab_ids, dtype=torch.float32)
        return self._parts[tli]

    def config(self, cls, **defaults):
        """An instance of the dataclass ``cls`` from ``defaults`` and the ``--opt`` values naming its fields.
        Keys consumed are noted so the builder can refuse the ones nobody read (``check_all_used``)."""
        self._classes.append(cls)
        return apply_options(cls, self.options, self._used, **defaults)

    def check_all_used(self) -> None:
        unknown = sorted(set(self.options) - self._used)
        if unknown:
            option_names = sorted({f.name for c in self._classes for f in dataclasses.fields(c)})
            raise RecipeOptionError(f"recipe {self.kind!r} has no option {', '.join(unknown)} "
                                    f"(it takes: {', '.join(option_names) or 'none'})")


def apply_options(cls, options: Mapping[str, str], used: set[str] | None = None, **defaults):
    hints = typing.get_type_hints(cls)
    values = dict(defaults)
    for f in dataclasses.fields(cls):
        if f.name in options:
            values[f.name] = _parse(hints[f.name], options[f.name], f.name, cls)
            if used is not None:
                used.add(f.name)
    return cls(**values)


def _parse(kind, text: str, name: str, cls):
    try:
        if kind is bool:
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        if kind in (int, float, str):
            return kind(text)
    except ValueError:
        raise RecipeOptionError(f"--opt {name}={text}: {cls.__name__}.{name} is of type {kind.__name__}") from None
    raise RecipeOptionError(f"--opt {name}: {cls.__name__}.{name} cannot be set from the command line")


def eagle_head(ctx: RecipeContext) -> EagleHead:
    return EagleHead(EagleConfig(ctx.store.shape.hidden_size, **ctx.sizes))


def build_eagle(ctx: RecipeContext) -> EagleRecipe:
    cfg = ctx.config(EagleRecipeConfig)
    ctx.check_all_used()
    return load_init(ctx, EagleRecipe(eagle_head(ctx), ctx.parts(), cfg))


def moa_model(ctx: RecipeContext):
    shape = ctx.store.shape
    return new_moa(MoAConfig(shape.hidden_size, shape.kv_size, shape.num_layers, tli=ctx.tli, **ctx.sizes))


def calibrate_moa(recipe: MoARecipe, ctx: RecipeContext) -> MoARecipe:
    sample = ctx.store.split("train")[:64]
    recipe.calibrate([ctx.store.load(f, (f"act{ctx.tli}",)) for f in sample])
    return recipe


def build_moa(ctx: RecipeContext) -> MoARecipe:
    cfg = ctx.config(MoARecipeConfig)
    ctx.check_all_used()
    return load_init(ctx, calibrate_moa(MoARecipe(moa_model(ctx), ctx.parts(ctx.tli), cfg), ctx))


def init_states(path: Path, kind: str) -> dict[str, dict[str, torch.Tensor]]:
    """Module states (as ``Recipe.trainable()`` names them) of a run folder's ``checkpoint.pt``,
    a ``.pt`` checkpoint, or a saved drafter of ``kind`` (``eagle.safetensors`` / MoA folder)."""
    path = Path(path)
    ckpt = path / "checkpoint.pt" if path.is_dir() else path
    if ckpt.suffix == ".pt" and ckpt.is_file():
        return torch.load(ckpt, map_location="cpu", weights_only=False)["modules"]
    if not path.exists():
        raise RecipeOptionError(f"--init {path}: no such run folder or drafter file")
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError, find_checkpoint
    from edgespec.shared.drafters.eagle.model import load_eagle
    from edgespec.shared.drafters.moa.model import load_moa

    try:
        found = find_checkpoint(path)
        if kind == "eagle":
            return {"head": load_eagle(found)[0].state_dict()}
        moa = load_moa(found)
    except DrafterCheckpointError as exc:
        raise RecipeOptionError(f"--init {path}: no checkpoint.pt and no {kind} drafter there ({exc})") from None
    return {"lsa": moa.lsa.state_dict(), "client": moa.client.state_dict()}


def load_init(ctx: RecipeContext, recipe):
    """The recipe, ``ctx.init``'s weights loaded into its trainable modules (nothing when no --init). Every
    recipe that trains the drafter's own modules goes through here, so that --init is never silently ignored:
    a first stage may start from a shipped drafter or another run (warm start), a second stage must."""
    if ctx.init is None:
        return recipe
    states = init_states(ctx.init, recipe.kind)
    modules: dict[str, nn.Module] = recipe.trainable()
    missing = sorted(set(modules) - set(states))
    if missing:
        raise RecipeOptionError(f"--init {ctx.init} holds {sorted(states)}, this {recipe.kind} recipe trains "
                                f"{sorted(modules)}: it is a run of another kind")
    for name, module in modules.items():
        try:
            module.load_state_dict(states[name])
        except RuntimeError as exc:
            first = str(exc).splitlines()[1:2] or [str(exc)]
            raise RecipeOptionError(f"--init {ctx.init}: its {name} has other sizes than this run's (give the "
                                    f"same --width/--heads/--vocab/--tli as stage 1): {first[0].strip()}") from None
    return recipe


Builder = Callable[[RecipeContext], object]
RECIPES: dict[str, tuple[Builder, str]] = {
    "eagle": (build_eagle, "EAGLE-2 head: SmoothL1 on features + 0.1 soft CE, feature noise"),
    "moa": (build_moa, "Mixture of Attentions (LSA server part, SA + CA client part, TLI 0/1/3)"),
}
# Modules that register more recipes (each defines RECIPES like the dict above).
RECIPE_MODULES = ("hass", "coral", "router_recipe", "beagle_recipe")


def all_recipes() -> dict[str, tuple[Builder, str]]:
    out = dict(RECIPES)
    for name in RECIPE_MODULES:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{name}":
                raise
            continue  # not part of this build
        out.update(getattr(module, "RECIPES", {}))
    return out


def build(ctx: RecipeContext):
    recipes = all_recipes()
    if ctx.kind not in recipes:
        raise RecipeOptionError(f"no training recipe {ctx.kind!r} (known: {', '.join(sorted(recipes))})")
    return recipes[ctx.kind][0](ctx)
