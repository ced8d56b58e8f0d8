"""Measure EAGLE-2 tree shapes for the independent drafter on this machine (how the defaults were picked).

    python -m edgespec.client.tree_sweep --shapes 3x6x16@0.02,2x12x20@0.05 --humaneval 2 --mtbench 2

A shape is BxDxM@min_prob. One server on loopback, one client, the same prompts
for every shape, shapes interleaved per prompt; prints tokens/s, tau, and the
drafting and verification time per generated token.
"""
from __future__ import annotations

import argparse
import sys

import torch


def parse_shape(text: str):
    from .drafters.tree_builder import TreeShape

    try:
        text, slash, feed = text.partition("/")
        if slash and feed != "all":
            raise ValueError(f"the only suffix is /all (feed every frontier node), not /{feed}")
        dims, _, prob = text.partition("@")
        b, d, m = (int(x) for x in dims.lower().split("x"))
        return TreeShape(b, d, m, float(prob) if prob else TreeShape().min_prob, prune_frontier=not slash)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not BxDxM[@min_prob][/all]: {err}") from None


def main(argv: list[str] | None = None) -> int:
    from edgespec.server.app import ServerConfig, start_server
    from edgespec.shared.models import load_model
    from edgespec.shared.models.registry import DEFAULT_DRAFTER, DEFAULT_TARGET
    from edgespec.netem.bench.prompt_sets import humaneval_prompts, mtbench_first_turns

    from .drafters.factory import DrafterOptions
    from .drafters.independent import IndependentConfig, IndependentDrafter
    from .edge_client import ClientConfig, EdgespecClient, chat_prompt_ids
    from .generation import GenerationConfig
    from .link import LinkConfig

    p = argparse.ArgumentParser(prog="python -m edgespec.client.tree_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", required=True, help="comma-separated BxDxM[@min_prob]")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--drafter-model", default=DEFAULT_DRAFTER)
    p.add_argument("--humaneval", type=int, default=2)
    p.add_argument("--mtbench", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    prompts = humaneval_prompts(args.humaneval) + mtbench_first_turns(args.mtbench)
    small = load_model(args.drafter_model, device="cpu")
    server = start_server(ServerConfig(model=args.target, http_port=None, device="cpu"))
    totals = {s: [0, 0.0, 0, 0.0, 0.0] for s in shapes}  # tokens, seconds, calls, draft_s, verify_s
    try:
        link = LinkConfig(server.address, min_deadline_s=60, max_deadline_s=600)
        clients = {s: EdgespecClient(ClientConfig(link, DrafterOptions("independent")), tokenizer=small.tokenizer,
                                     drafter=IndependentDrafter.from_model(small.model, IndependentConfig(s))) for s in shapes}
        warm = chat_prompt_ids(small.tokenizer, [{"role": "user", "content": "Say hello."}])
        clients[shapes[0]].generate(warm, GenerationConfig(max_new_tokens=4))
        for prompt in prompts:
            ids = chat_prompt_ids(small.tokenizer, prompt.messages())
            for s, client in clients.items():
                m = client.generate(ids, GenerationConfig(max_new_tokens=args.max_tokens)).metrics
                t = totals[s]
                t[0] += m.new_tokens
                t[1] += m.wall_s
                t[2] += m.calls
                t[3] += m.draft_s
                t[4] += m.verify_s
                print(f"{prompt.id} B{s.branch} D{s.depth} M{s.max_nodes} p{s.min_prob}: "
                      f"{m.tokens_per_s:.2f} tok/s tau {m.acceptance_length:.2f}", file=sys.stderr, flush=True)
    finally:
        server.stop(grace=1.0)
    print(f"| B | D | M | min_prob | tokens/s | tokens per call | draft s/token | verify s/token |  ({torch.get_num_threads()} threads)")
    print("|---|---|---|---|---|---|---|---|")
    for s, (n, secs, calls, ds, vs) in totals.items():
        print(f"| {s.branch} | {s.depth} | {s.max_nodes} | {s.min_prob} | {n / secs:.2f} | {n / calls:.2f} | "
              f"{ds / n:.3f} | {vs / n:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
