"""Measure EAGLE-2 tree shapes for the independent drafter on this machine (how the defaults were picked).

    edgespec bench tree-sweep --shapes 3x6x16@0.02,2x12x20@0.05 --humaneval 2 --mtbench 2

A shape is BxDxM@min_prob. One server on loopback, one client, the same prompts
for every shape, shapes interleaved per prompt; prints tokens/s, tau, and the
drafting and verification time per generated token.
"""
from __future__ import annotations

import argparse
import sys

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
    add_prompt_arguments(p, humaneval=2, mtbench=2, max_tokens=64)


def run(args: argparse.Namespace) -> int:
    import torch

    from edgespec.client import ClientConfig, DrafterOptions, EdgespecClient, GenerationConfig, chat_prompt_ids
    from edgespec.shared.metrics import GenerationMetrics
    from edgespec.shared.models import load_model
    from .loopback import loopback_server, patient_link
    from .records import markdown_table

    shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    prompts = chosen_prompts(args)
    small = load_model(args.drafter_model, device="cpu")
    totals = {s: GenerationMetrics() for s in shapes}  # summed over prompts
    with loopback_server(args.target) as server:
        link = patient_link(server.address)
        clients = {s: EdgespecClient(ClientConfig(link, DrafterOptions("independent", args.drafter_model, tree=s)),
                                     tokenizer=small.tokenizer, small_model=small.model) for s in shapes}
        warm = chat_prompt_ids(small.tokenizer, [{"role": "user", "content": "Say hello."}])
        clients[shapes[0]].generate(warm, GenerationConfig(max_new_tokens=4))
        for prompt in prompts:
            ids = chat_prompt_ids(small.tokenizer, prompt.messages())
            for s, client in clients.items():
                m = client.generate(ids, GenerationConfig(max_new_tokens=args.max_tokens)).metrics
                totals[s].add(m)
                print(f"{prompt.id} B{s.branch} D{s.depth} M{s.max_nodes} p{s.min_prob}: "
                      f"{m.tokens_per_s:.2f} tok/s tau {m.acceptance_length:.2f}", file=sys.stderr, flush=True)
    print(markdown_table(["B", "D", "M", "min_prob", "tokens/s", "tokens per call", "draft s/token", "verify s/token"],
                         [[s.branch, s.depth, s.max_nodes, s.min_prob, f"{m.tokens_per_s:.2f}",
                           f"{m.new_tokens / m.calls:.2f}", f"{m.draft_s / m.new_tokens:.3f}",
                           f"{m.verify_s / m.new_tokens:.3f}"] for s, m in totals.items()]))
    print(f"({torch.get_num_threads()} threads)")
    return 0

