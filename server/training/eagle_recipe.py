"""EAGLE training: teacher-forced rows plus optional unrolled steps (training-time test).

Row r reads (f_r, c_{r+1}) and predicts h_{r+1}. Step 1 is teacher-forced (f = the target's
feature, with noise). Step s >= 2 feeds, for every start r, the previous step's predicted
feature and drafted token (masks.unrolled_mask): exactly what drafting does, so the same
code measures per-position acceptance on validation and, with ``unroll`` > 1, trains on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from edgespec.shared.drafters.blocks import causal_mask, unrolled_mask
from edgespec.shared.drafters.eagle.model import EagleHead, save_eagle
from edgespec.shared.drafters.target_parts import TargetParts
from .features import StoredSequence
from .losses import Acceptance, Term, chain_accepted, smooth_l1, soft_cross_entropy
from .recipe import LossTerm, Outputs


@dataclass(frozen=True)
class EagleRecipeConfig:
    noise: float = 0.05  # uniform feature noise, as a fraction of the features' RMS (EAGLE's robustness trick)
    feature_weight: float = 1.0  # SmoothL1 on predicted features
    ce_weight: float = 0.1  # soft cross-entropy against the target's distribution
    unroll: int = 1  # training steps per start (> 1: training-time test)
    unroll_weight: float = 1.0  # weight of each unrolled step's terms relative to step 1
    detach: bool = False  # HASS: unrolled steps feed the previous step's features detached (no gradient back)
    data_tokens: bool = False  # HASS: unrolled steps read the data's next tokens, not the drafted ones


class DraftStep(NamedTuple):
    """One unrolled step for every start."""

    pred: torch.Tensor  # predicted features [n, E]
    ids: torch.Tensor  # drafted draft-vocabulary ids [n] (the argmax of ``logits``)
    logits: torch.Tensor | None  # [n, V'] with their graph, kept for the loss (keep_logits) so the LM head,
    # most of a training step, runs once per step rather than again in the loss; None otherwise


def unrolled_steps(head: EagleHead, parts: TargetParts, tokens: torch.Tensor, feats: torch.Tensor,
                   positions: torch.Tensor, steps: int, detach: bool = False,
                   data_tokens: bool = False, keep_logits: bool = False) -> list[DraftStep]:
    """Per step s (1..steps) a ``DraftStep`` for the n = len(tokens) - 1 starts. feats: [n, E] features f_r
    fed at step 1.

    detach: step s reads step s-1's features detached, so step s's loss trains the head as it is
    used at that step (on the features it made) without reshaping the earlier steps (HASS).
    data_tokens: step s of start r reads the data token c_{r+s} (the accepted path on data the
    target generated greedily) instead of step s-1's argmax; rows past the window keep the argmax.
    """
    n = tokens.shape[0] - 1

    def step(pred: torch.Tensor) -> DraftStep:
        logits = parts.logits(pred)
        return DraftStep(pred, logits.detach().argmax(-1), logits if keep_logits else None)

    pred, kv = head(parts.embed(tokens[1:]), feats, positions[:n], causal_mask(n, tokens.device))
    out = [step(pred)]
    past = kv
    for s in range(2, steps + 1):
        prev_pred, prev_ids = out[-1].pred, out[-1].ids
        ids = parts.to_target_ids(prev_ids)
        if data_tokens:
            k = max(0, n + 1 - s)  # starts r <= n - s have their token c_{r+s} in the window
            ids = torch.cat([tokens[s:s + k], ids[k:]])
        feed = prev_pred.detach() if detach else prev_pred
        pred, kv = head(parts.embed(ids), feed, positions[:n] + s - 1, unrolled_mask(n, s, tokens.device), past)
        past = past.cat(kv)
        out.append(step(pred))
    return out


@torch.no_grad()
def eagle_acceptance(head: EagleHead, parts: TargetParts, seq: StoredSequence, depth: int,
                     drafting=None) -> Acceptance:
    """Per-position acceptance of the chains drafted from every start of a sequence. ``drafting``: the
    parts the drafter's own steps read (the router's head tap; default ``parts``); the target's greedy
    picks always come through the full head."""
    tokens, h = seq.tokens, seq.hidden
    n = tokens.shape[0] - 1
    if n <= depth:
        return Acceptance(0, [0] * depth)
    positions = torch.arange(tokens.shape[0], device=tokens.device)
    steps = unrolled_steps(head, parts if drafting is None else drafting, tokens, h[:n], positions, depth)
    greedy = parts.logits(h).argmax(-1)  # target's greedy pick at each position (draft vocab)
    target_ok = parts.to_target_ids(greedy[:-1]) == tokens[1:]  # the data follows the target here
    starts = n - depth
    matches = torch.stack([(steps[s][1][:starts] == greedy[s + 1:s + 1 + starts])
                           & target_ok[s + 1:s + 1 + starts] for s in range(depth)], 1)
    keep = seq.loss_mask[1:1 + starts]
    return Acceptance.of(chain_accepted(matches[keep]), depth)


class HeadRecipe:
    """A head that drafts from the target's last hidden states (EAGLE, Beagle), trained on the target's
    next states (SmoothL1, ``feature_weight``) and its distribution (soft CE, ``ce_weight``)."""

    feature_names = ("hidden",)

    def __init__(self, head, parts: TargetParts, config):
        self.head, self.parts, self.config = head, parts, config
        self.terms = [LossTerm("feature", config.feature_weight, self._feature_term),
                      LossTerm("ce", config.ce_weight, self._ce_term)]

    def trainable(self):
        return {"head": self.head}


class EagleRecipe(HeadRecipe):
    kind = "eagle"

    def forward(self, seq: StoredSequence, start: int, end: int, gen: torch.Generator) -> Outputs:
        tokens, h = seq.tokens[start:end], seq.hidden[start:end]
        pos = torch.arange(start, end, device=tokens.device)
        n = tokens.shape[0] - 1
        rms = h.pow(2).mean().sqrt()
        noise = (torch.rand(h[:n].shape, generator=gen).to(h.device) * 2 - 1) * self.config.noise * rms
        steps = unrolled_steps(self.head, self.parts, tokens, h[:n] + noise, pos, self.config.unroll,
                               self.config.detach, self.config.data_tokens, keep_logits=True)
        w = seq.loss_mask[start + 1:end].float()
        with torch.no_grad():
            target_logits = self.parts.logits(h[1:])
        return {"steps": steps, "target": h, "target_logits": target_logits, "w": w, "n": n}

    def _feature_term(self, out: Outputs) -> Term:
        return self._per_step(out, lambda step, tgt, tl, w: smooth_l1(step.pred, tgt, w))

    def _ce_term(self, out: Outputs) -> Term:
        return self._per_step(out, lambda step, tgt, tl, w: soft_cross_entropy(step.logits, tl, w))

    def _per_step(self, out: Outputs, fn) -> Term:
        """fn(the step's first m rows as a DraftStep, target features, target logits, weights) per step."""
        n, h, tl, w = out["n"], out["target"], out["target_logits"], out["w"]
        terms = []
        for s, step in enumerate(out["steps"], start=1):
            m = n - (s - 1)  # starts whose step-s target h_{r+s} lies in the window
            if m <= 0:
                break
            rows = DraftStep(step.pred[:m], step.ids[:m], None if step.logits is None else step.logits[:m])
            t = fn(rows, h[s:s + m], tl[s - 1:s - 1 + m], w[:m])
            scale = 1.0 if s == 1 else self.config.unroll_weight
            terms.append(Term(t.total * scale, t.weight * scale))
        return sum(terms)

    def acceptance(self, seq: StoredSequence, depth: int) -> Acceptance:
        return eagle_acceptance(self.head, self.parts, seq, depth)

    def save_drafter(self, out_dir: Path) -> list[Path]:
        return [save_eagle(self.head, Path(out_dir) / "eagle.safetensors", self.parts.vocab_ids)]
