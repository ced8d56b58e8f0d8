"""Measure EAGLE-2 tree shapes for a drafter on this machine (how the defaults were picked).

    edgespec bench tree-sweep --shapes 3x6x16@0.02,2x12x20@0.05 --humaneval 2 --mtbench 2
    edgespec bench tree-sweep --drafter eagle --shapes 2x12x16@0.2,3x8x24@0.05,4x8x32@0.02

A shape is BxDxM@min_prob. One server on loopback, one client per shape (each drafts its own shape every
step: the loop's fixed trees), one drafter shared by them, the same prompts for every shape, shapes
interleaved per prompt; prints tokens/s, tau, accept@1, nodes and drafting time per tree (its own, and with
the trees drafted ahead for guesses that missed), and the drafting and verification time per generated token.
``--drafter`` is any drafter with next-token distributions: the independent 0.5B (default) or a learned one
(``eagle``, ``moa-tli1``, a kind with ``--checkpoint``).
On a CPU server a tree's nodes cost verification time that a GPU server barely pays, so tau and accept@1
are the figures that carry over; ``bench gpu-projection`` turns them into a GPU server's tokens/s.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from .prompt_sets import add_prompt_arguments, chosen_prompts


def parse_shape(text: str):
    from edgespec.client import TreeShape

    try:
        text, slash, feed = text.partition("/")
        if slash and feed != "all":
            raise ValueError(f"the only suffix is /all (feed every frontier node), not /{feed}")
        dims, _, prob = text.partition("@")
        b, d, m = (int(x) for x in dims.lower().split("x"))
        return TreeShape(b, d, m, float(prob) if prob else TreeShape().min_prob, prune_frontier=not slash)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not BxDxM[@min_prob][/all]: {err}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", required=True, help="comma-separated BxDxM[@min_prob]")
    p.add_argument("--drafter", default="independent",
                   help="independent (the small model, default) or a learned drafter: eagle, moa, a shipped "
                        "checkpoint's name (moa-tli1), or a kind with --checkpoint")
    p.add_argument("--checkpoint", default=None, help="a learned drafter's checkpoint folder (a training run's)")
    p.add_argument("--out", default=None,
                   help="write every generation's client metrics as JSON here, each shape a method named "
                        "DRAFTER:BxDxM@min_prob (what `bench gpu-projection` reads)")
    add_prompt_arguments(p, humaneval=2, mtbench=2, max_tokens=64)


def sweep_options(args: argparse.Namespace, shape):
    """The DrafterOptions the sweep's drafter is built from (with the first shape; each client sets its own)."""
    from edgespec.client import DrafterOptions

    if args.drafter == "independent":
        if args.checkpoint:
            raise ValueError("--checkpoint is for learned drafters; the independent drafter takes --drafter-model")
        return DrafterOptions("independent", args.drafter_model, tree=shape)
    if args.drafter == "ngram":
        raise ValueError("ngram drafts no distributions, so it has no tree shape to sweep")
    return DrafterOptions(args.drafter, checkpoint=args.checkpoint, target=args.target, tree=shape)


def run(args: argparse.Namespace) -> int:
    import torch

    from edgespec.client import (ClientConfig, EdgespecClient, GenerationConfig, chat_prompt_ids, load_tokenizer,
                                 make_drafter)
    from edgespec.shared.drafters.checkpoint import resolve_checkpoint
    from edgespec.shared.metrics import GenerationMetrics
    from edgespec.shared.models import load_model
    from .drafting import recorded
    from .loopback import loopback_server, patient_link
    from .records import markdown_table

    shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    if not shapes:
        args.parser.error("--shapes names no shape")
    try:
        options = sweep_options(args, shapes[0])
    except ValueError as err:
        args.parser.error(str(err))
    prompts = chosen_prompts(args)
    if options.name == "independent":  # a drafter per shape on one loaded small model
        small = load_model(args.drafter_model, device="cpu")
        tokenizer = small.tokenizer
        drafters = {s: make_drafter(replace(options, tree=s), small_model=small.model) for s in shapes}
    else:  # one learned drafter (its model and the target's parts loaded once) whose shape is set per generation
        tokenizer, shared = load_tokenizer(args.target), make_drafter(options)
        drafters = dict.fromkeys(shapes, shared)
    part = drafters[shapes[0]].feature_request().moa_server_part
    moa = {part: str(resolve_checkpoint(options.checkpoint or part))} if part else {}  # MoA's server part
    totals = {s: GenerationMetrics() for s in shapes}  # summed over prompts
    runs = []  # each generation, as `bench drafting --out` keeps them
    with loopback_server(args.target, moa_server_parts=moa) as server:
        link = patient_link(server.address)
        clients = {s: EdgespecClient(ClientConfig(link, replace(options, tree=s)), tokenizer=tokenizer,
                                     drafter=drafters[s]) for s in shapes}

        def generate(s, ids, max_new):
            if options.name != "independent":
                drafters[s].tree = s  # each generation starts the drafter afresh (Drafter.start)
            return clients[s].generate(ids, GenerationConfig(max_new_tokens=max_new)).metrics

        generate(shapes[0], chat_prompt_ids(tokenizer, [{"role": "user", "content": "Say hello."}]), 4)
        for prompt in prompts:
            ids = chat_prompt_ids(tokenizer, prompt.messages())
            for s in shapes:
                m = generate(s, ids, args.max_tokens)
                totals[s].add(m)
                runs.append({"method": shape_name(drafters[s].name, s), "prompt": prompt.id, "metrics": asdict(m)})
                print(f"{prompt.id} B{s.branch} D{s.depth} M{s.max_nodes} p{s.min_prob}: "
                      f"{m.tokens_per_s:.2f} tok/s tau {m.acceptance_length:.2f}", file=sys.stderr, flush=True)
    print(f"{drafters[shapes[0]].name}: {len(prompts)} prompts, {args.max_tokens} new tokens at most, fixed trees")
    print(markdown_table(["B", "D", "M", "min_prob", "tokens/s", "tau", "accept@1", "nodes per tree",
                          "draft ms per tree (own / with missed guesses)", "draft s/token", "verify s/token"],
                         [shape_row(s, m) for s, m in totals.items()]))
    print(f"({torch.get_num_threads()} threads)")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": recorded(args), "runs": runs}, indent=1))
    return 0


def shape_name(drafter: str, s) -> str:
    """ "eagle:3x10x24@0.05": a drafter and its shape, as `bench link --drafters` names one."""
    return f"{drafter}:{s.branch}x{s.depth}x{s.max_nodes}@{s.min_prob}" + ("" if s.prune_frontier else "/all")


def shape_row(s, m) -> list:
    """One shape's summed generations as a table row (tau: tokens committed per verification)."""
    drafts = m.num_drafts or 1
    at1 = m.accepted_per_position[0] / drafts if m.accepted_per_position else 0.0
    return [s.branch, s.depth, s.max_nodes, s.min_prob, f"{m.tokens_per_s:.2f}", f"{m.acceptance_length:.2f}",
            f"{at1:.2f}", f"{m.num_draft_tokens / drafts:.1f}",
            f"{1000 * m.own_draft_s / drafts:.0f} / {1000 * m.draft_s / drafts:.0f}",
            f"{m.draft_s / m.new_tokens:.3f}", f"{m.verify_s / m.new_tokens:.3f}"]
