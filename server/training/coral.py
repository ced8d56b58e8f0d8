"""CORAL's cross-step representation alignment on the EAGLE drafter: ``eagle+coral``.

CORAL trains like HASS, unrolling n drafting steps (``unroll``, default 3, detached own
features, data tokens: ``hass.HASS_EAGLE_DEFAULTS``), and adds a contrastive term: the
drafter's features of one position, predicted at different steps (from contexts holding
0, 1, .. n-1 of its own features), should agree, because decoding reaches a position after
any number of drafted steps. Step s of start r predicts the feature of position r + s, so
the features of position p are row p - s of every step s; positions predicted by all n
steps (p = n..window end) enter ``alignment_losses.cross_step_alignment``: InfoNCE with
cosine similarity and a temperature, the same position at another step as the positive,
the other positions of the window as negatives, over every pair of steps. It adds to the
regression (SmoothL1) and classification (soft CE) terms with weight ``align_weight``.

The feature aligned is the head's output (the LM-head input it predicts): it is what the
next step reads and what the LM head turns into the draft distribution. The defaults
(temperature 0.1, weight 0.1) are ours, chosen so the term starts about as large as the CE.
The LM-head router, CORAL's other half, is its own recipe (``router_recipe``).

``moa+coral``: MoA drafts every position of a T-step segment at once, at steps 1..T past the
verified prefix, so its "unrolled steps" are passes with the segments shifted: pass a
(a = 0..``passes``-1, default 3 passes) cuts the window at offset o + a, so a position sits at a
different step in every pass (T >= passes). Each pass is exact decoding (``moa_recipe``), TLI included. The
MoA terms apply to every pass; the aligned feature is the predicted activation, standardised
per channel as the regression sees it; positions every pass bounds (p >= o + passes - 1) align.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from edgespec.shared.drafters.blocks import step_bounds
from .alignment_losses import cross_step_alignment
from .eagle_recipe import EagleRecipe, EagleRecipeConfig
from .features import StoredSequence
from .hass import HASS_EAGLE_DEFAULTS
from .losses import Term
from .moa_recipe import MoARecipe, MoARecipeConfig
from .recipe import LossTerm, Outputs
from .recipes import RecipeContext, RecipeOptionError, calibrate_moa, eagle_head, load_init, moa_model


@dataclass(frozen=True)
class CoralConfig:
    temperature: float = 0.1  # InfoNCE temperature over cosine similarities
    align_weight: float = 0.1  # weight of the cross-step alignment term in the total loss


@dataclass(frozen=True)
class MoACoralConfig:
    passes: int = 3  # MoA: passes with the segments shifted by one token (each position at `passes` steps)


def aligned_step_features(steps: list[torch.Tensor], w: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per step s (1..S) the predicted features of positions S..n, row for row, and their weights.

    steps[s-1]: [n, E], row r = the feature of position r + s; w: [n], w[r] = weight of
    position r + 1 (the recipe's per-start weights). Returns ([m, E] per step, [m]), m = n - S + 1.
    """
    S, n = len(steps), steps[0].shape[0]
    m = max(0, n - S + 1)
    return [pred[S - s:S - s + m] for s, pred in enumerate(steps, start=1)], w[S - 1:S - 1 + m]


class EagleCoralRecipe(EagleRecipe):
    def __init__(self, head, parts, config: EagleRecipeConfig, coral: CoralConfig):
        super().__init__(head, parts, config)
        self.coral = coral
        self.terms.append(LossTerm("align", coral.align_weight, self._align_term))

    def _align_term(self, out: Outputs) -> Term:
        feats, w = aligned_step_features([step.pred for step in out["steps"]], out["w"])
        if feats[0].shape[0] < 2:  # a window too short for one position and a negative
            zero = feats[0].new_zeros(())
            return Term(zero, zero)
        return cross_step_alignment(feats, w, self.coral.temperature)


class MoACoralRecipe(MoARecipe):
    def __init__(self, model, parts, config: MoARecipeConfig, coral: CoralConfig, passes: int):
        super().__init__(model, parts, config)
        self.coral, self.passes = coral, passes
        base = self.terms
        # The MoA terms over every pass (each pass is more training data, drafted at other steps).
        self.terms = [LossTerm(t.name, t.weight, lambda out, fn=t.fn: sum(fn(p) for p in out["passes"]))
                      for t in base]
        self.terms.append(LossTerm("align", coral.align_weight, self._align_term))

    def forward(self, seq: StoredSequence, start: int, end: int, gen: torch.Generator) -> Outputs:
        c, n = self.config, end - start
        T = int(torch.randint(max(c.min_T, self.passes), max(c.max_T, self.passes) + 1, (1,), generator=gen))
        offset = int(torch.randint(0, T, (1,), generator=gen))
        passes = [self.window_outputs(seq, start, end, step_bounds(n, T, offset + a, seq.tokens.device))
                  for a in range(self.passes)]
        return {"passes": passes, "first_bounded": offset + self.passes - 1}

    def _align_term(self, out: Outputs) -> Term:
        z, first = self.model.client.standardise, out["first_bounded"]
        feats = [z(p["act"])[first:] for p in out["passes"]]
        if feats[0].shape[0] < 2:
            zero = feats[0].new_zeros(())
            return Term(zero, zero)
        return cross_step_alignment(feats, out["passes"][0]["w"][first:], self.coral.temperature)


def build_moa_coral(ctx: RecipeContext) -> MoACoralRecipe:
    coral = ctx.config(CoralConfig)
    passes = ctx.config(MoACoralConfig).passes
    cfg = ctx.config(MoARecipeConfig)
    ctx.check_all_used()
    if passes < 2:
        raise RecipeOptionError(f"--opt passes={passes}: CORAL aligns a position across passes, so it needs >= 2")
    if coral.temperature <= 0:
        raise RecipeOptionError(f"--opt temperature={coral.temperature}: the InfoNCE temperature must be > 0")
    return load_init(ctx, calibrate_moa(MoACoralRecipe(moa_model(ctx), ctx.parts(ctx.tli), cfg, coral, passes), ctx))


def build_eagle_coral(ctx: RecipeContext) -> EagleCoralRecipe:
    coral = ctx.config(CoralConfig)
    cfg = ctx.config(EagleRecipeConfig, **HASS_EAGLE_DEFAULTS)
    ctx.check_all_used()
    if cfg.unroll < 2:
        raise RecipeOptionError(f"--opt unroll={cfg.unroll}: CORAL aligns features across unrolled steps, "
                                "so it needs unroll >= 2")
    if coral.temperature <= 0:
        raise RecipeOptionError(f"--opt temperature={coral.temperature}: the InfoNCE temperature must be > 0")
    return load_init(ctx, EagleCoralRecipe(eagle_head(ctx), ctx.parts(), cfg, coral))


RECIPES = {
    "eagle+coral": (build_eagle_coral, "EAGLE + CORAL: 3 unrolled steps (as HASS) + cross-step InfoNCE "
                                       "alignment of the predicted features"),
    "moa+coral": (build_moa_coral, "MoA + CORAL: 3 passes with shifted step bounds + cross-step InfoNCE "
                                   "alignment of the predicted activations"),
}
