"""Beagle training: two-stage block-attention training of the cross-attention drafter.

``edgespec train fit --kind beagle --opt stage=early`` (the default), then
``--kind beagle --opt stage=late --init RUN_OF_THE_EARLY_STAGE``.

- early: inverse block attention (beagle.masks.inverse_block_mask): the window is cut into
  blocks of k at a random offset; each block's own states are hidden from its queries, so
  query b + m predicts h_{b+m} from states ending at b - 1: a multi-token prediction loss
  over the window (steps 1..k of a draft rooted at c_b, in one pass).
- late: simulated multi-step drafting in constant memory (beagle.masks.simulated_mask):
  step 1 is the early pass; step i >= 2 feeds step i-1's predicted states back, detached,
  as the keys inside each block (keys stay [target ; previous step]: 2n whatever k). Step i
  weighs the positions it is first exact for (place j = m + 1 >= i) with beta(i, j) = k - i + 1;
  positions exact at an earlier step would come out the same and are not recomputed.

Loss (like EAGLE): SmoothL1 on the predicted states + soft cross-entropy against the target's
distribution. Validation drafts chains from every root the way the runtime does (its own
drafted tokens and states, beagle.masks.chain_mask).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from edgespec.shared.drafters.beagle.masks import (block_starts, chain_mask, inverse_block_mask, late_step_weights,
                                                   simulated_mask)
from edgespec.shared.drafters.beagle.model import (FILE_NAME, BeagleConfig, BeagleHead, cat_memory, load_beagle,
                                                   save_beagle)
from edgespec.shared.drafters.target_parts import TargetParts
from .eagle_recipe import HeadRecipe
from .features import StoredSequence
from .losses import Acceptance, Term, chain_accepted, smooth_l1, soft_cross_entropy
from .recipe import Outputs
from .recipes import RecipeContext, RecipeOptionError

log = logging.getLogger(__name__)
STAGES = ("early", "late")


@dataclass(frozen=True)
class BeagleRecipeConfig:
    stage: str = "early"  # "early": inverse block attention + MTP loss; "late": simulated drafting (use --init)
    block: int = 4  # k: local keys hidden per block (early) and simulated steps (late)
    noise: float = 0.05  # uniform noise on the target's states, as a fraction of their RMS (as EAGLE)
    feature_weight: float = 1.0  # SmoothL1 on the predicted states
    ce_weight: float = 0.1  # soft cross-entropy against the target's distribution
    blocks: int = 1  # cross-attention blocks of a new drafter (ignored with --init: the checkpoint's)


def draft_chains(head: BeagleHead, parts: TargetParts, tokens: torch.Tensor, states: torch.Tensor,
                 positions: torch.Tensor, depth: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step 1..depth: (predicted states [n, E], drafted draft-vocab ids [n]) of the chains
    rooted at every position r (the shape of eagle_recipe.unrolled_steps).

    Step s queries the token drafted at step s-1 (step 1: c_r) at position r + s - 1 and sees
    the target's states before r plus its own chain's earlier predicted states."""
    n = tokens.shape[0]
    memory = head.memory(states, positions)
    ids, out = tokens, []
    for s in range(1, depth + 1):
        pred = head(parts.embed(ids), positions + s - 1, memory, chain_mask(n, s, tokens.device))
        drafted = parts.logits(pred).argmax(-1)
        out.append((pred, drafted))
        memory = cat_memory(memory, head.memory(pred, positions + s - 1))
        ids = parts.to_target_ids(drafted)
    return out


class BeagleRecipe(HeadRecipe):
    kind = "beagle"

    def __init__(self, head: BeagleHead, parts: TargetParts, config: BeagleRecipeConfig = BeagleRecipeConfig()):
        if config.stage not in STAGES:
            raise RecipeOptionError(f"--opt stage={config.stage}: Beagle's stages are {' and '.join(STAGES)}")
        if config.block < 1:
            raise RecipeOptionError(f"--opt block={config.block}: the block size k must be >= 1")
        super().__init__(head, parts, config)

    def forward(self, seq: StoredSequence, start: int, end: int, gen: torch.Generator) -> Outputs:
        k = self.config.block
        tokens, h = seq.tokens[start:end], seq.hidden[start:end]
        n, dev = tokens.shape[0], tokens.device
        pos = torch.arange(start, end, device=dev)
        offset = int(torch.randint(k, (1,), generator=gen))
        rms = h.pow(2).mean().sqrt()
        noisy = h + (torch.rand(h.shape, generator=gen).to(dev) * 2 - 1) * self.config.noise * rms
        # row t predicts h_t -> c_{t+1}: it counts when c_{t+1} is a token to learn and some target state is visible
        learn = torch.zeros(n, device=dev)
        learn[:-1] = seq.loss_mask[start + 1:end].float()
        learn = learn * (block_starts(n, k, offset, dev) > 0).float()
        embeds = self.parts.embed(tokens)
        memory = self.head.memory(noisy, pos)
        pred = self.head(embeds, pos, memory, inverse_block_mask(n, k, offset, dev))
        every = torch.arange(n, device=dev)
        if self.config.stage == "early":
            steps = [(pred, learn, every)]
        else:
            steps = [(pred, learn * late_step_weights(n, k, offset, 1, dev), every)]
            place = every - block_starts(n, k, offset, dev)  # m: the position's place in its block
            mask = simulated_mask(n, k, offset, dev)
            fed_states = pred.detach()
            for i in range(2, k + 1):
                # rows at place m < i - 1 were exact at an earlier step and would come out the same: skip them
                rows = every[place >= i - 1]
                fed = cat_memory(memory, self.head.memory(fed_states, pos))
                pred = self.head(embeds[rows], pos[rows], fed, mask[rows])
                steps.append((pred, (learn * late_step_weights(n, k, offset, i, dev))[rows], rows))
                fed_states = fed_states.index_copy(0, rows, pred.detach())
        with torch.no_grad():
            target_logits = self.parts.logits(h)
        return {"steps": steps, "target": h, "target_logits": target_logits}

    def _feature_term(self, out: Outputs) -> Term:
        return self._sum(out, lambda pred, w, rows: smooth_l1(pred, out["target"][rows], w))

    def _ce_term(self, out: Outputs) -> Term:
        return self._sum(out, lambda pred, w, rows: soft_cross_entropy(self.parts.logits(pred),
                                                                        out["target_logits"][rows], w))

    @staticmethod
    def _sum(out: Outputs, fn) -> Term:
        return sum(fn(pred, w, rows) for pred, w, rows in out["steps"])

    @torch.no_grad()
    def acceptance(self, seq: StoredSequence, depth: int) -> Acceptance:
        tokens, h = seq.tokens, seq.hidden
        n = tokens.shape[0]
        starts = n - 1 - depth  # roots r = 1..starts: a state before them, targets for every step
        if starts < 1:
            return Acceptance(0, [0] * depth)
        positions = torch.arange(n, device=tokens.device)
        drafted = draft_chains(self.head, self.parts, tokens, h, positions, depth)
        greedy = self.parts.logits(h).argmax(-1)  # target's greedy pick after each position (draft vocab)
        target_ok = self.parts.to_target_ids(greedy[:-1]) == tokens[1:]  # the data follows the target here
        roots = torch.arange(1, starts + 1, device=tokens.device)
        matches = torch.stack([(drafted[s][1][roots] == greedy[roots + s]) & target_ok[roots + s]
                               for s in range(depth)], 1)
        keep = seq.loss_mask[roots]
        return Acceptance.of(chain_accepted(matches[keep]), depth)

    def save_drafter(self, out_dir: Path) -> list[Path]:
        return [save_beagle(self.head, Path(out_dir) / FILE_NAME, self.parts.vocab_ids)]


def initial_state(path: Path) -> tuple[dict, dict | None]:
    """(head state dict, config or None) of a run folder's ``checkpoint.pt`` or a ``beagle.safetensors``."""
    path = Path(path)
    ckpt = path / "checkpoint.pt" if path.is_dir() else None
    if ckpt is not None and ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)["modules"]
        if "head" not in state:
            raise RecipeOptionError(f"--init {path}: its checkpoint.pt holds {sorted(state)}, not a drafter head")
        return state["head"], None
    file = path / FILE_NAME if path.is_dir() else path
    if not file.is_file():
        raise RecipeOptionError(f"--init {path}: neither a run folder with checkpoint.pt nor a {FILE_NAME}")
    head, _ = load_beagle(file)
    return head.state_dict(), vars(head.config)


def initial_head(ctx: RecipeContext, cfg: BeagleRecipeConfig) -> BeagleHead:
    """A new head (sizes from the command line), or the ``--init`` run's / file's, weights loaded."""
    hidden = ctx.store.shape.hidden_size
    if ctx.init is None:
        if cfg.stage == "late":
            log.warning("Beagle's late stage without --init trains a new drafter; the recipe starts it from the "
                        "early stage's run")
        return BeagleHead(BeagleConfig(hidden, blocks=cfg.blocks, **ctx.sizes))
    state, config = initial_state(ctx.init)
    if config is None:  # a run's checkpoint.pt: sizes from the command line, blocks from the weights
        blocks = {int(key.split(".")[1]) for key in state if key.startswith("blocks.")}
        if not blocks:
            raise RecipeOptionError(f"--init {ctx.init}: its checkpoint holds no Beagle drafter")
        config = {"hidden_size": hidden, "blocks": max(blocks) + 1, **ctx.sizes}
    if config["hidden_size"] != hidden:
        raise RecipeOptionError(f"--init {ctx.init} was trained for a target of hidden size "
                                f"{config['hidden_size']}, the feature store's is {hidden}")
    head = BeagleHead(BeagleConfig(**config))
    try:
        head.load_state_dict(state)
    except RuntimeError as exc:
        raise RecipeOptionError(f"--init {ctx.init} does not fit the drafter asked for (--width/--heads must "
                                f"match the early run's): {str(exc)[:300]}") from None
    return head


def build_beagle(ctx: RecipeContext) -> BeagleRecipe:
    cfg = ctx.config(BeagleRecipeConfig)
    ctx.check_all_used()
    return BeagleRecipe(initial_head(ctx, cfg), ctx.parts(), cfg)


RECIPES = {
    "beagle": (build_beagle, "Beagle cross-attention drafter: --opt stage=early (inverse block attention, "
                             "MTP over k=block) then stage=late --init EARLY_RUN (simulated drafting, beta=k-i+1)"),
}
