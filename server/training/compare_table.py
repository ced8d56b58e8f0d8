"""The training-recipe comparison as a Markdown table, read from the runs' cards.

    python -m edgespec.server.training.compare_table eagle=runs/fit8/eagle \\
        eagle+hass=runs/fit8/eagle-hass-s1+runs/fit8/eagle-hass eagle+router=runs/fit8/eagle+runs/fit8/eagle-router ...

Each entry is ``NAME=RUN[+RUN...]``: the stages of one recipe in order; the figures are the last
stage's validation (the trainer's: greedy chains of ``eval_depth`` draft tokens from every position
of the held-out sequences, each position drafting from the target's own features), the budget is
summed over the stages. The first entry of a family (``eagle``, ``moa``) is the base each later
``eagle...``/``moa...`` entry is compared with; ``X+router`` is compared with ``X``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load_entry(text: str) -> tuple[str, list[dict]]:
    """``NAME=RUN[+RUN...]`` -> (NAME, the stages' cards)."""
    name, sep, runs = text.partition("=")
    if not sep or not name or not runs:
        raise ValueError(f"an entry is NAME=RUN[+RUN...], got {text!r}")
    cards = []
    for run in runs.split("+"):
        path = Path(run) / "card.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: has the run {run} finished?")
        cards.append(json.loads(path.read_text()))
    return name, cards


def row_of(name: str, cards: list[dict]) -> dict:
    last = cards[-1]
    val = last.get("validation", {})
    steps = sum(c["training"]["steps"] for c in cards)
    tokens = sum(c["training"]["steps"] * c["training"]["config"]["batch_tokens"] for c in cards)
    at = [val.get(f"val/accept@{k}", 0.0) for k in range(1, 7)]
    return {"name": name, "recipe": " -> ".join(c.get("recipe", c.get("kind", "?")) for c in cards),
            "steps": steps, "tokens": tokens, "mean_accepted": val.get("val/mean_accepted", 0.0),
            "accept_at": at, "chains": val.get("val/chains", 0)}


def table(rows: list[dict]) -> str:
    base: dict[str, float] = {}
    taus = {r["name"]: 1.0 + r["mean_accepted"] for r in rows}
    lines = ["| drafter | stages (recipes) | steps | training tokens | acceptance length (1 + mean accepted) "
             "| vs its base | accept@1 / @2 / @3 / @4 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        tau = 1.0 + r["mean_accepted"]
        fam = r["name"].split("+")[0].split("-")[0]  # eagle+hass, eagle-hass-s1 -> eagle
        base.setdefault(fam, tau)
        # a router is compared with the drafter it routes (its stage-1 drafter, frozen), others with the family's base
        ref = taus.get(r["name"].removesuffix("+router"), base[fam]) if r["name"].endswith("+router") else base[fam]
        rel = f"{100 * (tau / ref - 1):+.1f} %" if ref else "-"
        at = " / ".join(f"{a:.3f}" for a in r["accept_at"][:4])
        lines.append(f"| {r['name']} | {r['recipe']} | {r['steps']} | {r['tokens']:,} | {tau:.3f} | {rel} | {at} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgespec.server.training.compare_table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("entries", nargs="+", metavar="NAME=RUN[+RUN...]")
    args = p.parse_args(argv)
    try:
        rows = [row_of(*load_entry(e)) for e in args.entries]
    except (ValueError, FileNotFoundError) as exc:
        p.error(str(exc))
    chains = {r["chains"] for r in rows}
    print(table(rows))
    print(f"\nvalidation chains per drafter: {', '.join(str(c) for c in sorted(chains))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
