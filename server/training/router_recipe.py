"""CORAL's LM-head router, trained as a second stage: ``eagle+router`` and ``moa+router``.

    edgespec train fit --kind eagle+router --init runs/eagle --out runs/eagle-router [--opt n_groups=32 ...]

The base drafter (an ``eagle`` / ``moa`` run folder, or its saved files) is loaded from
``--init`` and frozen: only the router trains. For every row the drafter would draft from,
the router reads the drafter's predicted LM-head input and learns the target's probability
mass per vocabulary group: the loss is KL(q || router), q = the sum of the target's
probabilities over each group's tokens (the cross-entropy against q minus q's entropy: the
same gradients, and 0 when the router is exact). ``missed_mass`` (logged, weight 0) is the target's mass
outside the router's top-g groups. Validation drafts with the router (the draft's argmax
restricted to the chosen groups), so the logged acceptance is the acceptance it costs
(the frozen base's ``acceptance`` with a plain ``_HeadTap`` is the same measure with the full head).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from edgespec.shared.drafters.eagle.model import EagleHead, load_eagle, save_eagle
from edgespec.shared.drafters.blocks import step_bounds
from edgespec.shared.drafters.moa.model import MoADrafterModel, load_moa
from edgespec.shared.drafters.router import (LMHeadRouter, RouterConfig, contiguous_groups, frequency_groups,
                                       group_probabilities, restrict_to_groups, save_router)
from edgespec.shared.drafters.target_parts import TargetParts
from .eagle_recipe import eagle_acceptance, unrolled_steps
from .features import FeatureStore, StoredSequence
from .losses import Acceptance, Term
from .moa_recipe import moa_acceptance, moa_window, save_moa_drafter
from .recipe import LossTerm, Outputs
from .recipes import RecipeContext, RecipeOptionError, eagle_head, moa_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouterRecipeConfig:
    n_groups: int = 32  # N: vocabulary groups
    top_g: int = 4  # groups computed per drafted row
    router_hidden: int = 256  # width of the router's two layers
    split: str = "frequency"  # "frequency" (by training-data frequency rank) or "contiguous" (id ranges)
    unroll: int = 3  # EAGLE: draft depths per start whose predicted features train the router
    min_T: int = 5  # MoA: smallest step bound drawn per window (as the base recipe draws them)
    max_T: int = 15  # MoA: largest step bound drawn per window


def group_kl(scores: torch.Tensor, group_target: torch.Tensor, w: torch.Tensor) -> Term:
    """KL(target's mass per group || router's group distribution): the cross-entropy against the
    group target minus its entropy, so 0 is reachable and the logged value is the router's own error.
    scores: [T, N] router logits; group_target: [T, N] (rows sum to 1); w: [T]."""
    q = group_target.float()
    per_row = (q * (torch.log(q.clamp_min(1e-12)) - torch.log_softmax(scores.float(), -1))).sum(-1)
    return Term((per_row * w).sum(), w.sum())


def missed_mass(scores: torch.Tensor, group_target: torch.Tensor, top_g: int, w: torch.Tensor) -> Term:
    """The target's probability mass outside the router's top-g groups, per row."""
    kept = group_target.gather(1, scores.topk(top_g, dim=-1).indices).sum(-1)
    return Term(((1 - kept) * w).sum().detach(), w.sum())


def token_counts(store: FeatureStore, vocab_size: int, vocab_ids: torch.Tensor | None) -> torch.Tensor:
    """[V'] occurrences of each draft-vocabulary token in the training split."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for f in store.split("train"):
        ids = store.load(f, ()).tokens
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size].double()
    return counts if vocab_ids is None else counts[vocab_ids.cpu()]


class _HeadTap:
    """Stands in for TargetParts inside a base drafter's own code (``unrolled_steps``, ``moa_window``):
    records what enters the LM head and answers with the full logits, the logits restricted to a
    router's groups (``route``), or nothing (``record_only``, when only the head's input is wanted)."""

    def __init__(self, parts: TargetParts, route=None, record_only: bool = False):
        self._parts, self._route, self._record_only = parts, route, record_only
        self.inputs: list[torch.Tensor] = []

    def __getattr__(self, name):
        return getattr(self._parts, name)

    def logits(self, hidden: torch.Tensor):
        self.inputs.append(hidden)
        if self._record_only:
            return None
        full = self._parts.logits(hidden)
        return full if self._route is None else self._route(hidden, full)


class EagleBase:
    """A frozen EAGLE head: the rows it drafts from, and its acceptance through a head tap."""

    kind = "eagle"
    feature_names = ("hidden",)

    def __init__(self, head: EagleHead, parts: TargetParts, unroll: int):
        self.head, self.parts, self.unroll = _frozen(head), parts, unroll

    def rows(self, seq: StoredSequence, start: int, end: int, gen: torch.Generator, to_groups):
        """(LM-head inputs [R, E], target mass per group [R, N], row weights [R]) of every unrolled step."""
        self.head.to(self.parts.head_weight.device)
        tokens, h = seq.tokens[start:end], seq.hidden[start:end]
        n = tokens.shape[0] - 1
        pos = torch.arange(start, end, device=tokens.device)
        steps = unrolled_steps(self.head, self.parts, tokens, h[:n], pos, self.unroll)  # no noise: as drafting
        target = to_groups(self.parts.logits(h[1:]))  # [n, N]: row r is the distribution of c_{r+2}
        w = seq.loss_mask[start + 1:end].float()
        hidden, groups, weights = [], [], []
        for s, step in enumerate(steps, start=1):
            m = n - (s - 1)  # starts whose step-s target lies in the window
            if m <= 0:
                break
            hidden.append(step.pred[:m])
            groups.append(target[s - 1:s - 1 + m])
            weights.append(w[:m])
        return torch.cat(hidden), torch.cat(groups), torch.cat(weights)

    def acceptance(self, seq: StoredSequence, depth: int, tap: _HeadTap) -> Acceptance:
        """EagleRecipe.acceptance with the drafted tokens read through ``tap``."""
        self.head.to(self.parts.head_weight.device)
        return eagle_acceptance(self.head, self.parts, seq, depth, drafting=tap)

    def save(self, out_dir: Path) -> tuple[list[Path], Path]:
        """(base files, the router's path beside them)."""
        path = save_eagle(self.head, Path(out_dir) / "eagle.safetensors", self.parts.vocab_ids)
        return [path], path.parent


class MoABase:
    """A frozen MoA drafter: the rows it drafts from, and its acceptance through a head tap."""

    kind = "moa"

    def __init__(self, model: MoADrafterModel, parts: TargetParts, min_T: int, max_T: int):
        _frozen(model.lsa)
        _frozen(model.client)
        self.model, self.parts, self.min_T, self.max_T = model, parts, min_T, max_T
        self.tli = model.client.config.tli
        self.feature_names = ("hidden", "kv")

    def _to_device(self) -> None:
        device = self.parts.head_weight.device
        self.model.lsa.to(device)
        self.model.client.to(device)

    def rows(self, seq: StoredSequence, start: int, end: int, gen: torch.Generator, to_groups):
        """(LM-head inputs [n, E], target mass per group [n, N], row weights [n]) under a random step bound."""
        self._to_device()
        tokens, kv = seq.tokens[start:end], seq.kv[start:end].float()
        n = tokens.shape[0]
        T = int(torch.randint(self.min_T, self.max_T + 1, (1,), generator=gen))
        offset = int(torch.randint(0, T, (1,), generator=gen))
        tap = _HeadTap(self.parts, record_only=True)
        moa_window(self.model, tap, tokens, kv, torch.arange(start, end, device=tokens.device),
                   step_bounds(n, T, offset, tokens.device))
        target = to_groups(self.parts.logits(seq.hidden[start:end]))  # row i: the distribution of c_{i+1}
        w = torch.cat([seq.loss_mask[start + 1:end].float(), torch.zeros(1, device=tokens.device)])
        return tap.inputs[-1], target, w

    def acceptance(self, seq: StoredSequence, depth: int, tap: _HeadTap) -> Acceptance:
        """MoARecipe.acceptance with the drafter's logits read through ``tap``."""
        self._to_device()
        return moa_acceptance(self.model, self.parts, seq, depth, drafting=tap)

    def save(self, out_dir: Path) -> tuple[list[Path], Path]:
        files = save_moa_drafter(self.model, self.parts, out_dir)
        return files, files[0].parent


def _frozen(module: torch.nn.Module) -> torch.nn.Module:
    for p in module.parameters():
        p.requires_grad_(False)
    return module.eval()


class RouterRecipe:
    """Stage 2: a frozen base drafter (``EagleBase`` / ``MoABase``) and the router that trains."""

    def __init__(self, base, router: LMHeadRouter):
        self.base, self.router, self.parts = base, router, base.parts
        self.kind = base.kind  # what the client loads: the base's kind, with router.safetensors beside it
        self.feature_names = base.feature_names
        self.terms = [LossTerm("router", 1.0, lambda out: group_kl(out["scores"], out["groups"], out["w"])),
                      LossTerm("missed_mass", 0.0, lambda out: missed_mass(out["scores"], out["groups"],
                                                                           router.config.top_g, out["w"]))]
        self._group_of = router.group_of()

    def trainable(self):
        return {"router": self.router}

    def _to_groups(self, logits: torch.Tensor) -> torch.Tensor:
        return group_probabilities(logits, self._group_of.to(logits.device), self.router.config.n_groups)

    def forward(self, seq: StoredSequence, start: int, end: int, gen: torch.Generator) -> Outputs:
        with torch.no_grad():
            hidden, target, w = self.base.rows(seq, start, end, gen, self._to_groups)
        return {"scores": self.router(hidden), "groups": target, "w": w}

    def _route(self, hidden: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        return restrict_to_groups(full, self.router.choose(hidden), self._group_of.to(full.device))

    @torch.no_grad()
    def acceptance(self, seq: StoredSequence, depth: int) -> Acceptance:
        """Per-position acceptance drafting with the router."""
        return self.base.acceptance(seq, depth, _HeadTap(self.parts, route=self._route))

    def save_drafter(self, out_dir: Path) -> list[Path]:
        files, beside = self.base.save(Path(out_dir))
        self.router.vocab_ids = self.parts.vocab_ids
        return files + [save_router(self.router, beside / "router.safetensors")]


def _init_path(ctx: RecipeContext) -> Path:
    if ctx.init is None:
        raise RecipeOptionError(f"{ctx.kind!r} is a second stage: pass --init with the run folder of an "
                                f"{ctx.kind.split('+')[0]} fit (or its drafter files)")
    init = Path(ctx.init)
    if not init.exists():
        raise RecipeOptionError(f"--init {init} does not exist")
    if ctx.run_dir is not None and init.resolve() == Path(ctx.run_dir).resolve():
        raise RecipeOptionError(f"--init {init} is also the output folder: give the router's run its own --out "
                                f"(the first stage's checkpoint.pt would be read as the router's)")
    return init


def _stage1_state(run: Path, module: str) -> dict | None:
    """The float32 weights of ``module`` in a run folder's checkpoint.pt (None when there is none)."""
    ckpt = run / "checkpoint.pt"
    if not ckpt.is_file():
        return None
    modules = torch.load(ckpt, map_location="cpu", weights_only=False)["modules"]
    if module not in modules:
        raise RecipeOptionError(f"{ckpt} holds {sorted(modules)}, not the base drafter's {module!r}: --init takes "
                                f"the first stage's run folder")
    return modules[module]


def _load_state(module: torch.nn.Module, state: dict, where: Path) -> None:
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise RecipeOptionError(f"the base drafter in {where} has other sizes than this run's (pass the first "
                                f"stage's --width/--heads): {exc}") from None


def _run_vocab(run: Path) -> torch.Tensor | None:
    saved = run / "vocab_ids.pt"
    return torch.load(saved) if saved.is_file() else None


def _use_vocab(ctx: RecipeContext, vocab: torch.Tensor | None) -> None:
    """The second stage drafts over the base's vocabulary: take it, or refuse a --vocab that differs."""
    if ctx.vocab_ids is None:
        ctx.vocab_ids = vocab
        return
    if vocab is None or not torch.equal(ctx.vocab_ids.cpu(), vocab.cpu()):
        has = "the full vocabulary" if vocab is None else f"{len(vocab)} tokens"
        raise RecipeOptionError(f"the base drafter drafts over {has}, not this run's --vocab: leave --vocab out "
                                f"(the router's stage uses the base's vocabulary)")


def _check_width(ctx: RecipeContext, hidden_size: int, init: Path) -> None:
    if hidden_size != ctx.store.shape.hidden_size:
        raise RecipeOptionError(f"the base drafter in {init} is for hidden size {hidden_size}, the feature store's "
                                f"target has {ctx.store.shape.hidden_size}")


def load_eagle_base(ctx: RecipeContext) -> tuple[EagleHead, torch.Tensor | None]:
    """(head, reduced-vocabulary ids or None) from --init: an eagle.safetensors file or an eagle run folder."""
    init = _init_path(ctx)
    if init.is_file():
        head, vocab = load_eagle(init)
    else:
        saved = init / "eagle.safetensors"
        head, vocab = load_eagle(saved) if saved.is_file() else (eagle_head(ctx), _run_vocab(init))
        state = _stage1_state(init, "head")
        if state is None and not saved.is_file():
            raise RecipeOptionError(f"{init} holds neither checkpoint.pt nor eagle.safetensors of an eagle fit")
        if state is not None:  # the run's float32 weights rather than the shipped bf16 copy
            _load_state(head, state, init)
    _check_width(ctx, head.config.hidden_size, init)
    return head, vocab


def load_moa_base(ctx: RecipeContext) -> MoADrafterModel:
    """From --init: a MoA folder (client + server safetensors) or a moa run folder."""
    init = _init_path(ctx)
    if (init / "client.safetensors").is_file():
        model = load_moa(init)
    else:
        folders = sorted(p.parent for p in init.glob("moa-tli*/client.safetensors"))
        if len(folders) > 1:
            raise RecipeOptionError(f"{init} holds several MoA drafters ({', '.join(map(str, folders))}): "
                                    f"pass --init with one of them")
        model = load_moa(folders[0]) if folders else moa_model(ctx)
        lsa, client = _stage1_state(init, "lsa"), _stage1_state(init, "client")
        if (lsa is None or client is None) and not folders:
            raise RecipeOptionError(f"{init} holds neither checkpoint.pt nor a moa-tli*/ folder of a moa fit")
        if lsa is not None and client is not None:
            _load_state(model.lsa, lsa, init)
            _load_state(model.client, client, init)
        if model.vocab_ids is None:
            model.vocab_ids = _run_vocab(init)
    _check_width(ctx, model.client.config.hidden_size, init)
    return model


def new_router(ctx: RecipeContext, parts: TargetParts, cfg: RouterRecipeConfig) -> LMHeadRouter:
    vocab = parts.draft_vocab_size
    try:
        rc = RouterConfig(parts.shape.hidden_size, vocab, cfg.n_groups, cfg.top_g, cfg.router_hidden, cfg.split)
    except ValueError as exc:
        raise RecipeOptionError(f"--opt: {exc}") from None
    if cfg.split == "frequency":
        order, offsets = frequency_groups(token_counts(ctx.store, parts.shape.vocab_size, parts.vocab_ids),
                                          cfg.n_groups)
    else:
        order, offsets = contiguous_groups(vocab, cfg.n_groups)
    return LMHeadRouter(rc, order, offsets, parts.vocab_ids)


def _config(ctx: RecipeContext) -> RouterRecipeConfig:
    cfg = ctx.config(RouterRecipeConfig)
    ctx.check_all_used()
    return cfg


def build_eagle_router(ctx: RecipeContext) -> RouterRecipe:
    cfg = _config(ctx)
    head, vocab = load_eagle_base(ctx)
    _use_vocab(ctx, vocab)
    parts = ctx.parts()
    return RouterRecipe(EagleBase(head, parts, cfg.unroll), new_router(ctx, parts, cfg))


def build_moa_router(ctx: RecipeContext) -> RouterRecipe:
    cfg = _config(ctx)
    model = load_moa_base(ctx)
    _use_vocab(ctx, model.vocab_ids)
    parts = ctx.parts(model.client.config.tli)
    return RouterRecipe(MoABase(model, parts, cfg.min_T, cfg.max_T), new_router(ctx, parts, cfg))


RECIPES = {
    "eagle+router": (build_eagle_router, "stage 2 (--init an eagle run): CORAL's LM-head router on a frozen EAGLE"),
    "moa+router": (build_moa_router, "stage 2 (--init a moa run): CORAL's LM-head router on a frozen MoA"),
}
