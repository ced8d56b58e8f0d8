"""HASS (harmonized speculative sampling) on the EAGLE and MoA drafters: ``eagle+hass``, ``moa+hass``.

Two parts, after the paper:

1. Harmonized context alignment. While drafting, the j-th draft token past the last verified
   one is predicted from a context whose last j-1 features are the drafter's own. Training
   unrolls n steps (``unroll``, default 3): step j feeds step j-1's predicted features,
   *detached*, as the queries' feature input and (through the head's cache) as the last
   keys/values, under ``masks.unrolled_mask`` (the tests check it against the same
   mask indexed by position, as the paper draws it). Tokens are the data's (the accepted
   path: the data is the target's greedy output). Detached: step j learns to draft from the
   features the drafter really makes, and its loss does not bend the earlier steps towards
   being convenient context rather than right (an earlier step must be accepted first).

2. Harmonized objective distillation: a top-K loss over the target's K most probable tokens
   (``alignment_losses.topk_distillation``, K = ``topk`` = 10), weight ``topk_weight``. The
   published recipe turns it on in a second, shorter fine-tuning stage; here:

       edgespec train fit --kind eagle+hass ... --out runs/a                   # stage 1: topk_weight 0
       edgespec train fit --kind eagle+hass ... --out runs/b --init runs/a --opt stage=2 --steps N/5
                                                                               # stage 2: topk_weight 1.0

   ``stage=2`` only changes the default of ``topk_weight`` and demands ``--init`` (a stage-1
   run folder with ``checkpoint.pt``, the ``.pt`` itself, or a saved drafter); any stage may
   set ``topk_weight`` explicitly. The learning rate and steps of stage 2 are the trainer's
   (``--lr``, ``--steps``): give it a short, lower-rate run.

MoA: what "the drafter's own features" are. The client's Self-Attention reads token
embeddings only (drafted tokens; on the accepted path they are the data's), and its
Cross-Attention reads verified features only, so neither has own features to feed back. The
drafter's own features are its *predicted activations*: with TLI = N >= 1 the client runs
the target's last N layers on them, and their K/V are what later drafted tokens attend to
for every position past the verified prefix. MoA's T-step bounded masks already reproduce
what decoding sees several steps past the last verified token (each query of a segment sees
the verified prefix, the drafted tokens before it and the TLI K/V made from their predicted
activations): they are MoA's unroll, up to ``max_T`` steps in one pass, so ``moa+hass`` has no
``unroll`` of its own. HASS adds the detach (``MoARecipeConfig.detach_own``: those K/V come
from a no-grad pass, so each query's loss trains only its own prediction, for the reason
above) and the top-K distillation. With TLI = 0 there is nothing to detach and ``moa+hass``
is MoA with the top-K stage.
"""
from __future__ import annotations

from dataclasses import dataclass

from .alignment_losses import topk_distillation
from .eagle_recipe import EagleRecipe, EagleRecipeConfig
from .losses import Term
from .moa_recipe import MoARecipe, MoARecipeConfig
from .recipe import LossTerm, Outputs
from .recipes import (RecipeContext, RecipeOptionError, apply_options, calibrate_moa, eagle_head, load_init,
                      moa_model)

STAGE_TOPK_WEIGHT = {1: 0.0, 2: 1.0}  # default topk_weight of each stage


@dataclass(frozen=True)
class HassConfig:
    stage: int = 1  # 1: alignment only; 2: fine-tune a stage-1 run (--init) with the top-K loss on
    topk: int = 10  # K: the target's most probable tokens the distillation covers
    topk_weight: float = 0.0  # weight of the top-K loss (default by stage: 0 in stage 1, 1.0 in stage 2)


def hass_config(ctx: RecipeContext) -> HassConfig:
    """HassConfig from ``--opt``, with ``topk_weight`` defaulting by stage; refuses a bad stage/K."""
    stage = apply_options(HassConfig, {k: v for k, v in ctx.options.items() if k == "stage"}).stage
    if stage not in STAGE_TOPK_WEIGHT:
        raise RecipeOptionError(f"--opt stage={stage}: HASS has stages 1 (alignment) and 2 (top-K fine-tuning)")
    cfg = ctx.config(HassConfig, topk_weight=STAGE_TOPK_WEIGHT[stage])
    if cfg.topk < 1:
        raise RecipeOptionError(f"--opt topk={cfg.topk}: the top-K loss needs K >= 1")
    if stage == 2 and ctx.init is None:
        raise RecipeOptionError("HASS stage 2 fine-tunes a stage-1 run: give --init RUN_FOLDER "
                                "(the stage-1 --out, holding checkpoint.pt) or a saved drafter")
    return cfg


class _WithTopK:
    """A base recipe (EAGLE, MoA) with HASS's settings, plus its top-K term (``_topk_term``) when weighted."""

    def __init__(self, model, parts, config, hass: HassConfig):
        super().__init__(model, parts, config)
        self.hass = hass
        if hass.topk_weight > 0:
            self.terms.append(LossTerm("topk", hass.topk_weight, self._topk_term))


class EagleHassRecipe(_WithTopK, EagleRecipe):
    """EAGLE unrolled with detached own features and data tokens, plus the top-K term when weighted."""

    def _topk_term(self, out: Outputs) -> Term:
        k = self.hass.topk
        return self._per_step(out, lambda step, tgt, tl, w: topk_distillation(step.logits, tl, w, k))


class MoAHassRecipe(_WithTopK, MoARecipe):
    """MoA with detached own TLI context (``detach_own``), plus the top-K term when weighted."""

    def _topk_term(self, out: Outputs) -> Term:
        return topk_distillation(out["logits"], out["target_logits"], out["w"], self.hass.topk)


HASS_EAGLE_DEFAULTS = dict(unroll=3, detach=True, data_tokens=True)


def build_eagle_hass(ctx: RecipeContext) -> EagleHassRecipe:
    hass = hass_config(ctx)
    cfg = ctx.config(EagleRecipeConfig, **HASS_EAGLE_DEFAULTS)
    ctx.check_all_used()
    if cfg.unroll < 1:
        raise RecipeOptionError(f"--opt unroll={cfg.unroll}: unroll counts drafting steps, >= 1")
    return load_init(ctx, EagleHassRecipe(eagle_head(ctx), ctx.parts(), cfg, hass))


def build_moa_hass(ctx: RecipeContext) -> MoAHassRecipe:
    hass = hass_config(ctx)
    cfg = ctx.config(MoARecipeConfig, detach_own=True)
    ctx.check_all_used()
    # --init's weights load after the calibration: a stage-1 run's activation stats win
    return load_init(ctx, calibrate_moa(MoAHassRecipe(moa_model(ctx), ctx.parts(ctx.tli), cfg, hass), ctx))


RECIPES = {
    "eagle+hass": (build_eagle_hass, "EAGLE + HASS: 3 unrolled steps on detached own features; "
                                     "--opt stage=2 --init RUN adds the top-10 distillation"),
    "moa+hass": (build_moa_hass, "MoA + HASS: detached own TLI context; --opt stage=2 --init RUN adds "
                                 "the top-10 distillation"),
}
