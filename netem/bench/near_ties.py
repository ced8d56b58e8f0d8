"""Why an uncut drafter answer can differ from the target's own: near ties in bf16.

Speculative verification scores a whole tree in one forward pass; the plain endpoint scores one
token per pass. In bf16 the two round differently, and where the target's two best next tokens are
closer than that rounding (about 0.4 % of a logit), the two paths can pick different tokens and the
answers part ways. Both are the target's greedy answer to within its own arithmetic. This tool
finds, for every prompt of a `disconnect` run where the answer at B = never is not the target's own,
the first token where they part, and prints the target's two best logits there in float32.

    edgespec bench near-ties netem/results/link-disconnect/disconnect.jsonl.gz
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class Divergence:
    prompt_id: str
    position: int  # index of the first differing answer token
    own: int  # the target alone's token there
    drafted: int  # the speculative path's token there


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token lists differ (the shorter one's end counts as a
    difference when the other goes on); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergences(rows: list[dict], encode, system: str = "independent") -> list[Divergence]:
    """Where `system`'s uncut answers part from the target's own (answers re-encoded with `encode`:
    the run records text, and BPE gives the same ids for the same text in all but rare cases)."""
    own = {r["prompt_id"]: r["text"] for r in rows if r["system"] == "target"}
    out = []
    for r in rows:
        if r["system"] != system or r.get("cut_after") is not None or r["prompt_id"] not in own:
            continue
        a, b = encode(own[r["prompt_id"]]), encode(r["text"])
        i = first_difference(a, b)
        if i is not None and i < min(len(a), len(b)):
            out.append(Divergence(r["prompt_id"], i, a[i], b[i]))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jsonl", type=Path, help="a disconnect run's JSON lines")
    parser.add_argument("--system", default="independent", help="the drafter whose uncut answers to compare")


def run(args: argparse.Namespace) -> int:
    import torch

    from edgespec.client import chat_prompt_ids
    from edgespec.shared.models.loading import load_model
    from .prompt_sets import humaneval_prompts
    from .records import read_jsonl

    rows = read_jsonl(args.jsonl)
    settings = rows[0]["env"]["settings"]
    loaded = load_model(settings["model"], device="cpu")
    tok = loaded.tokenizer
    found = divergences(rows, lambda text: tok(text, add_special_tokens=False)["input_ids"], args.system)
    limit = (settings.get("set_limits") or {}).get("humaneval", settings["limit"])
    prompts = {p.id: p for p in humaneval_prompts(limit)}
    model = loaded.model.float()  # float32: the reference both bf16 paths approximate
    print(f"{len(found)} of the uncut answers part from the target's own")
    print("| problem | token | target alone | speculative | float32 top two | their logit gap |")
    print("|---|---|---|---|---|---|")
    for d in found:
        own = tok(next(r["text"] for r in rows if r["system"] == "target" and r["prompt_id"] == d.prompt_id),
                  add_special_tokens=False)["input_ids"]
        ids = chat_prompt_ids(tok, prompts[d.prompt_id].messages()) + own[: d.position]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, 2)
        names = ", ".join(f"`{tok.decode([t])!r}`" for t in top.indices.tolist())
        print(f"| {d.prompt_id} | {d.position} | `{tok.decode([d.own])!r}` | `{tok.decode([d.drafted])!r}` | {names} | "
              f"{float(top.values[0] - top.values[1]):.3f} |")
    return 0

