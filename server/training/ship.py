"""Turn a training run into a shipped checkpoint: ``shared/drafters/checkpoints/<name>/``.

Copies the drafter's files (EAGLE: ``eagle.safetensors``; MoA: ``client.safetensors`` and
``server.safetensors``, kept apart so the server loads only its part) and writes the card:
``card.json`` (the run's card plus how to reproduce it and what the benchmark measured) and
``CARD.md`` for people. Refuses a checkpoint over the size limit.

A run's snapshot (``RUN/snapshots/tokens-T/``, taken while the run goes on) ships too: its card is the
run's, written at the end of the run's last segment, with the snapshot's own step, tokens seen, training
data and validation figures in place of the run's.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from edgespec.shared.drafters.checkpoint import CHECKPOINT_DIR, DrafterCheckpointError, find_checkpoint
from edgespec.shared.drafters.router import router_path

MAX_BYTES = 25 * 1000 * 1000  # the limit per shipped drafter (25 MB on disk)


def ship(run_dir: str | Path, name: str, command: str = "", measured: dict | None = None,
         dest_root: Path = CHECKPOINT_DIR) -> Path:
    run_dir = Path(run_dir)
    ckpt = find_checkpoint(run_dir)
    files = [ckpt] if ckpt.is_file() else [ckpt / "client.safetensors", ckpt / "server.safetensors"]
    router = router_path(ckpt)
    if router.is_file():  # an LM-head router (second stage) travels with its drafter
        files.append(router)
    size = sum(f.stat().st_size for f in files)
    if size > MAX_BYTES:
        raise DrafterCheckpointError(f"{ckpt} is {size / 1e6:.1f} MB; shipped drafters stay under "
                                     f"{MAX_BYTES / 1e6:.0f} MB: train a narrower one")
    card = run_card(run_dir)
    init = card.get("init")
    if init and (Path(init) / "card.json").is_file():
        # Read before the copy below: a warm start from a shipped drafter is replaced by its successor.
        card["init_card"] = lineage(json.loads((Path(init) / "card.json").read_text()))
    dest = dest_root / name
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, dest / f.name)
    # The card is read on other machines: paths by their place in the repository or under the home folder.
    data = card.get("data", {})
    if "feature_store" in data:
        data["feature_store"] = ",".join(portable(p) for p in data["feature_store"].split(","))
    for key in ("init", "branch_from"):
        if card.get(key):
            card[key] = portable(card[key])
    card["files"] = {f.name: f.stat().st_size for f in files}
    card["name"] = name
    if command:
        card["command"] = command
    if measured:
        card["measured"] = measured
    (dest / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    (dest / "CARD.md").write_text(card_markdown(card))
    return dest


def portable(path: str) -> str:
    """A path as a shipped card names it: a shipped drafter as ``shared/drafters/checkpoints/NAME``,
    anything under the home folder from ``~``, the rest as it is."""
    resolved = Path(path).expanduser().resolve()
    if resolved.is_relative_to(CHECKPOINT_DIR):
        return str(Path("shared/drafters/checkpoints") / resolved.relative_to(CHECKPOINT_DIR))
    home = str(Path.home())
    return "~" + path[len(home):] if path == home or path.startswith(home + "/") else path


def lineage(card: dict) -> dict:
    """What a warm-started drafter's card keeps of the drafter it started from."""
    t, d = card.get("training", {}), card.get("data", {})
    return {"name": card.get("name"), "steps": t.get("steps"), "tokens_seen": t.get("tokens_seen"),
            "train_tokens": d.get("train_tokens"), "feature_store": d.get("feature_store"),
            "init": card.get("init")}


def run_card(run_dir: Path) -> dict:
    """The card of a run folder ({} if it has none), or of a snapshot inside one (its figures over the run's)."""
    marker = run_dir / "snapshot.json"
    if not marker.is_file():
        card_path = run_dir / "card.json"
        return json.loads(card_path.read_text()) if card_path.is_file() else {}
    run = run_dir.parent.parent  # RUN/snapshots/tokens-T
    if not (run / "card.json").is_file():
        raise DrafterCheckpointError(f"{run_dir} is a snapshot of {run}, which has no card.json yet: a run writes "
                                     f"its card when a segment ends (its --max-minutes, or kill PID for SIGTERM)")
    card = json.loads((run / "card.json").read_text())
    snap = json.loads(marker.read_text())
    card.setdefault("training", {}).update(steps=snap["step"], tokens_seen=snap["tokens_seen"],
                                           snapshot=run_dir.name)
    card.setdefault("data", {}).update(train_tokens=snap["train_tokens"], train_sequences=snap["train_sequences"])
    figures = {k: v for k, v in snap.items() if k.startswith("val/")}  # only where its step validated
    card["validation"] = {"step": snap["step"], **figures} if figures else {}
    return card


def card_markdown(card: dict) -> str:
    d, t, h, v = card.get("data", {}), card.get("training", {}), card.get("hardware", {}), card.get("validation", {})
    cfg = t.get("config", {})
    lines = [f"# Drafter `{card.get('name', '?')}` ({card.get('kind', '?')}) for `{card.get('target', '?')}`", "",
             "## Files", ""]
    lines += [f"- `{k}`: {n / 1e6:.2f} MB" for k, n in card.get("files", {}).items()]
    if card.get("recipe") and card.get("recipe") != card.get("kind"):
        lines += [f"- training recipe: `{card['recipe']}`"]
    lines += ["", "## Training", "",
              f"- data: feature store `{d.get('feature_store', '?')}`: {d.get('train_sequences', '?')} training "
              f"sequences ({d.get('train_tokens', '?')} tokens), {d.get('val_sequences', '?')} held out",
              f"- steps: {t.get('steps', '?')} of {cfg.get('batch_tokens', '?')} tokens, lr {cfg.get('lr', '?')}, "
              f"window {cfg.get('window', '?')}",
              f"- wall time (last run segment): {t.get('wall_s_this_run', '?')} s",
              f"- hardware: {h.get('processor', '?')}, {h.get('cpus', '?')} CPUs, {h.get('torch_threads', '?')} torch "
              f"threads, CUDA {h.get('cuda') or 'none'}"]
    if card.get("command"):
        lines += [f"- command: `{card['command']}`"]
    if card.get("branch_from"):
        lines += [f"- a branch of the run `{card['branch_from']}` (its cooldown)"]
    if card.get("init"):
        before = card.get("init_card") or {}
        was = (f" (`{before['name']}`: {before.get('steps')} steps, {before.get('tokens_seen')} tokens seen, "
               f"{before.get('train_tokens')} training tokens)" if before.get("name") else "")
        lines += [f"- warm start from `{card['init']}`{was}: the steps and tokens above are this run's own"]
    if v:
        lines += ["", "## Validation (held-out split, chains drafted from each position)", ""]
        lines += [f"- {k}: {val:.3f}" if isinstance(val, float) else f"- {k}: {val}"
                  for k, val in v.items() if k.startswith("val/")]
    if card.get("measured"):
        lines += ["", "## Measured", "", "```", json.dumps(card["measured"], indent=1), "```"]
    return "\n".join(lines) + "\n"
