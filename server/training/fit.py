"""`edgespec train fit`: build a recipe for a target and a feature store, train, ship the drafter.

The run folder gets ``checkpoint.pt`` (resume), ``metrics.jsonl``, ``log.txt``, and at the end
the drafter's files (``eagle.safetensors`` or ``moa-tli{N}/server|client.safetensors``) with
``card.json``: data, tokens, steps, wall time, hardware, and the last validation figures.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import time
from pathlib import Path

import torch

from edgespec.shared.device import cpu_name, pick_device
from edgespec.shared.drafters.vocab import most_frequent_ids
from . import distributed
from .features import FeatureStore, open_stores
from .recipes import RecipeContext, RecipeOptionError, build
from .trainer import TrainConfig, Trainer

log = logging.getLogger(__name__)


def reduced_vocab(store: FeatureStore, size: int, always: tuple[int, ...] = (),
                  run_dir: Path | None = None) -> torch.Tensor:
    """The ``size`` most frequent tokens of the training split. Kept in the run folder
    (``vocab_ids.pt``) so a resumed run drafts over the same list even if the store grew."""
    saved = None if run_dir is None else Path(run_dir) / "vocab_ids.pt"
    if saved is not None and saved.exists():
        ids = torch.load(saved)
        if len(ids) == size:
            return ids
    streams = (store.load(f, ()).tokens for f in store.split("train"))
    ids = most_frequent_ids(streams, size, store.shape.vocab_size, always)
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        torch.save(ids, saved)
    return ids


def build_recipe(kind: str, target_model, store: FeatureStore, tli: int = 0, width: int = 0, heads: int = 0,
                 vocab: int = 0, special_ids: tuple[int, ...] = (), seed: int = 0, unroll: int = 1,
                 run_dir: Path | None = None, options: dict[str, str] | None = None,
                 init: str | Path | None = None):
    """The recipe ``kind`` (``recipes.all_recipes()``) for a target (name, folder or loaded model) and a store."""
    check_store_holds(store, kind)
    vocab_ids = reduced_vocab(store, vocab, special_ids, run_dir) if vocab else None
    torch.manual_seed(seed)
    sizes = {k: v for k, v in {"width": width, "heads": heads, "mlp_hidden": 2 * width}.items() if v}
    options = dict(options or {})
    if unroll != 1:  # the older spelling of --opt unroll=N
        options.setdefault("unroll", str(unroll))
    ctx = RecipeContext(kind=kind, store=store, target=target_model, tli=tli, sizes=sizes, vocab_ids=vocab_ids,
                        options=options, init=None if init is None else Path(init), run_dir=run_dir)
    recipe = build(ctx)
    recipe.recipe_name = kind  # the card says which recipe trained it; recipe.kind says how to load it
    recipe.card_extra = {"options": options, "init": None if init is None else str(init)}  # a stage's lineage
    return recipe


# What each drafter family reads from a store: a recipe is named FAMILY or FAMILY+ALIGNMENT (eagle+hass).
HIDDEN_ONLY_FAMILIES = ("eagle", "beagle")  # the LM-head input alone; MoA also needs every layer's K/V


def check_store_holds(store, kind: str) -> None:
    """Refuse, before the recipe is built (MoA's calibration reads activations), a recipe whose features the
    store lacks: a hidden-only store for anything but the EAGLE-like families."""
    if store.meta.get("contents", "full") == "hidden" and kind.split("+")[0] not in HIDDEN_ONLY_FAMILIES:
        raise ValueError(f"the feature store {store.path} holds only the LM-head input (extracted with --contents "
                         f"hidden); the {kind!r} recipe also needs every layer's K/V and the TLI activations: "
                         f"extract a store with --contents full for it")


def parse_opts(pairs: list[str]) -> dict[str, str]:
    """``--opt KEY=VALUE`` pairs -> dict (a later key wins)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise RecipeOptionError(f"--opt takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def write_card(run_dir: Path, recipe, store: FeatureStore, trainer: Trainer, files: list[Path], wall_s: float) -> Path:
    last_val = next((r for r in reversed(trainer.history) if "val/chains" in r), {})
    card = {
        "kind": recipe.kind,
        "recipe": getattr(recipe, "recipe_name", recipe.kind),
        **getattr(recipe, "card_extra", {}),
        "target": store.meta["target"],
        "tokenizer_fingerprint": store.meta.get("fingerprint"),
        "files": {p.name if p.parent == run_dir else str(p.relative_to(run_dir)): p.stat().st_size for p in files},
        "data": {"feature_store": str(store.path), "train_sequences": len(trainer.train_files),
                 "val_sequences": len(store.split("val")), "train_tokens": store.tokens("train")},
        "training": {"steps": trainer.step, "tokens_seen": trainer.tokens_seen, "config": trainer.config.__dict__,
                     "wall_s_this_run": round(wall_s, 1), "processes": trainer.world.size},
        "hardware": {"machine": platform.machine(), "processor": cpu_name(),
                     "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                     "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "validation": last_val,
    }
    path = run_dir / "card.json"
    path.write_text(json.dumps(card, indent=1))
    return path


def feature_source(args, device=None):
    """The stored features (``--features DIR``) or the target computing them as training goes
    (``--features-from target --data DIR``)."""
    if getattr(args, "features_from", "store") == "target":
        from .online import TargetFeatures

        if not getattr(args, "data", None):
            raise ValueError("--features-from target needs --data DIR (the folder with samples.jsonl)")
        tli = tuple(sorted({0, args.tli}))
        return TargetFeatures(args.target, args.data, max_len=args.max_len, tli_depths=tli, device=device,
                              dtype=args.dtype)
    if not args.features:
        raise ValueError("give --features DIR (a feature store), or --features-from target --data DIR")
    return open_stores(args.features)


def branch_run(source: str | Path, run_dir: str | Path, copy: bool = True) -> bool:
    """Start ``run_dir`` from ``source``'s last checkpoint (weights, optimizer, step, data order) and draft
    vocabulary, leaving ``source`` as it is: a cooldown branch of a steady run that keeps training. A run
    folder that already has a checkpoint (a branch resumed) is left alone. ``copy`` False only checks the
    arguments (every rank under a launcher checks them; rank 0 copies). Returns whether it copied."""
    source, run_dir = Path(source), Path(run_dir)
    if source.resolve() == run_dir.resolve():
        raise ValueError(f"--branch-from {source} is the run folder itself: give the branch its own --out")
    if (run_dir / "checkpoint.pt").exists():
        return False
    if not (source / "checkpoint.pt").exists():
        raise ValueError(f"--branch-from {source}: no checkpoint.pt there (a `train fit` run folder has one after "
                         f"its first save)")
    if not copy:
        return False
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("vocab_ids.pt", "checkpoint.pt"):  # the checkpoint last: its presence marks a finished copy
        if (source / name).exists():
            tmp = run_dir / (name + ".tmp")
            shutil.copyfile(source / name, tmp)
            os.replace(tmp, run_dir / name)
    log.info("branched from %s", source)
    return True


def fit_from_args(args, cfg: TrainConfig) -> int:
    from transformers import AutoTokenizer

    from edgespec.shared.fingerprint import tokenizer_fingerprint
    from edgespec.shared.models.loading import model_location

    from .recipes import all_recipes

    if args.kind not in all_recipes():  # before any file is read: a typo should not cost a model load
        raise RecipeOptionError(f"no training recipe {args.kind!r} (known: {', '.join(sorted(all_recipes()))})")
    # Under a launcher this joins the process group and picks this process's GPU (cuda:LOCAL_RANK).
    device = distributed.init(args.device).device if int(os.environ.get("WORLD_SIZE", "1")) > 1 \
        else pick_device(args.device)
    store = feature_source(args, str(device))
    if getattr(args, "branch_from", None):  # before the recipe: it reads the run folder's vocab_ids.pt
        # Under a launcher the ranks share the run folder: one copy, which the others wait for.
        branch_run(args.branch_from, args.out, copy=int(os.environ.get("RANK", "0")) == 0)
        distributed.barrier()
    tok = AutoTokenizer.from_pretrained(model_location(args.target))
    if tokenizer_fingerprint(tok) != store.meta.get("fingerprint"):
        raise ValueError(f"the feature store was made with another tokenizer than {args.target}'s")
    specials = tuple(i for i in (tok.eos_token_id, tok.pad_token_id) if i is not None)
    # The target is only a source of frozen parts (embedding, norm, LM head, TLI layers): only those
    # are read from its files, so a training process does not hold the whole target.
    recipe = build_recipe(args.kind, args.target, store, tli=args.tli, width=args.width, heads=args.heads,
                          vocab=args.vocab, special_ids=specials, seed=args.seed, unroll=args.unroll,
                          run_dir=Path(args.out), options=parse_opts(getattr(args, "opt", None) or []),
                          init=getattr(args, "init", None))
    if getattr(args, "branch_from", None):  # a branch's card names where it came from, and that run's warm start
        recipe.card_extra["branch_from"] = str(args.branch_from)
        source_card = Path(args.branch_from) / "card.json"
        if recipe.card_extra.get("init") is None and source_card.is_file():
            recipe.card_extra["init"] = json.loads(source_card.read_text(encoding="utf-8")).get("init")
    run_dir = Path(args.out)
    trainer = Trainer(recipe, store, run_dir, cfg, device=device)
    t0 = time.perf_counter()
    trainer.fit()
    if not trainer.world.main:  # rank 0 writes the drafter and the card
        distributed.shutdown()
        return 0
    files = recipe.save_drafter(run_dir)
    card = write_card(run_dir, recipe, store, trainer, files, time.perf_counter() - t0)
    log.info("drafter written: %s; card %s", ", ".join(map(str, files)), card)
    print(card)
    distributed.shutdown()
    return 0
