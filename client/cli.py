"""`edgespec client`: generate against a server from the terminal, or `edgespec client serve` the local API.

    edgespec client --server HOST:PORT --drafter ngram --prompt "Write quicksort in Python"
    echo "prompt" | edgespec client --server HOST:PORT --drafter independent
    edgespec client serve --server HOST:PORT --drafter independent --port 8000
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def add_client_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `client`, `client serve` and `demo` (link, drafter, tree)."""
    # Defaults stay None here and come from TreeShape / NgramConfig when the client is built, so that
    # `edgespec --help` does not import torch.
    p.add_argument("--drafter", default="ngram", help="ngram | independent | eagle | moa (default: ngram)")
    p.add_argument("--drafter-model", default=None,
                   help="small LM of the independent drafter (registry name or directory; "
                        "default qwen2.5-coder-0.5b-instruct)")
    p.add_argument("--checkpoint", default=None, help="checkpoint of a learned drafter (eagle, moa)")
    p.add_argument("--tokenizer", default=None, help="the target's tokenizer (model name or directory); "
                                                      "default: the drafter's model or the server's model name")
    p.add_argument("--tree-branch", type=int, default=None, help="EAGLE-2 B: children per expanded node")
    p.add_argument("--tree-depth", type=int, default=None, help="EAGLE-2 D: deepest level drafted")
    p.add_argument("--tree-nodes", type=int, default=None, help="EAGLE-2 M: nodes kept in a tree")
    p.add_argument("--tree-min-prob", type=float, default=None,
                   help="stop deepening once the best path's probability is below this")
    p.add_argument("--ngram-nodes", type=int, default=None, help="nodes in an ngram tree")
    p.add_argument("--policy", choices=["rollback", "keep"], default="rollback",
                   help="offline tokens on reconnect: rollback (exactly the target's text) or keep (default rollback)")
    p.add_argument("--offline-wait", type=float, default=30.0,
                   help="seconds to wait for a lost link when the drafter cannot go on alone (default 30)")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--ca", default=None, help="PEM file of the CA that signed the server's certificate")
    p.add_argument("--api-key", default=None, help="API key the server asks for (default: $EDGESPEC_API_KEY)")
    p.add_argument("--min-deadline", type=float, default=1.0,
                   help="floor of a Draft's deadline in seconds (default 1.0)")


def client_from_args(args, address: str):
    from .drafters.factory import DrafterOptions
    from .drafters.ngram import NgramConfig
    from .drafters.tree_builder import TreeShape
    from .edge_client import ClientConfig, EdgespecClient
    from .link import LinkConfig
    from edgespec.shared.models.registry import DEFAULT_DRAFTER

    given = {"branch": args.tree_branch, "depth": args.tree_depth, "max_nodes": args.tree_nodes,
             "min_prob": args.tree_min_prob}
    tree = TreeShape(**{k: v for k, v in given.items() if v is not None})
    ngram = NgramConfig() if args.ngram_nodes is None else NgramConfig(max_nodes=args.ngram_nodes)
    options = DrafterOptions(name=args.drafter, model=args.drafter_model or DEFAULT_DRAFTER,
                             checkpoint=args.checkpoint, tree=tree, ngram=ngram)
    link = LinkConfig(address, tls=args.tls, root_certificates=args.ca,
                      api_key=args.api_key or os.environ.get("EDGESPEC_API_KEY"),
                      min_deadline_s=args.min_deadline, max_deadline_s=max(30.0, args.min_deadline))
    return EdgespecClient(ClientConfig(link, options, tokenizer=args.tokenizer))


def generation_config_from_args(args):
    from .commit import ResumePolicy
    from .generation import GenerationConfig

    return GenerationConfig(max_new_tokens=args.max_tokens, stop=tuple(args.stop or ()),
                            temperature=args.temperature, seed=args.seed,
                            resume_policy=ResumePolicy[args.policy.upper()], offline_wait_s=args.offline_wait)


def register(subparsers) -> None:
    p = subparsers.add_parser("client", help="generate with a remote verifier (or `client serve` a local API)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["run", "serve"], default="run",
                   help="run (default): generate for --prompt or stdin; serve: OpenAI-compatible local API")
    p.add_argument("--server", default="127.0.0.1:50051", help="the server's gRPC HOST:PORT (default 127.0.0.1:50051)")
    add_client_options(p)
    p.add_argument("--prompt", default=None, help="the prompt (default: read stdin)")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--max-tokens", type=int, default=512, help="most new tokens (default 512)")
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="colour tokens by origin: green accepted draft, plain target, yellow offline")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON on the last line")
    p.add_argument("--host", default="127.0.0.1", help="serve: interface of the local API (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="serve: port of the local API (default 8000)")
    p.add_argument("--local-api-key", default=None, help="serve: require this key from API callers")
    p.set_defaults(func=main)


def main(args) -> int:
    client = client_from_args(args, args.server)
    try:
        if args.action == "serve":
            return serve(client, args)
        return run_prompt(client, args)
    finally:
        client.close()


def serve(client, args) -> int:
    import uvicorn

    from .api import build_app
    from .commit import ResumePolicy

    app = build_app(client, default_max_tokens=args.max_tokens, policy=ResumePolicy[args.policy.upper()],
                    api_key=args.local_api_key)
    print(f"edgespec local API on http://{args.host}:{args.port}/v1 (model {client.model_name}, "
          f"drafter {client.drafter.name})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def run_prompt(client, args) -> int:
    from .render import TerminalPrinter, use_color

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        print("edgespec: error: empty prompt: pass --prompt or pipe text on stdin", file=sys.stderr)
        return 2
    ids = client.encode(prompt) if args.raw else client.encode_chat([{"role": "user", "content": prompt}])
    printer = TerminalPrinter(client.decode, sys.stdout, sys.stderr, use_color(args.color, sys.stdout))
    result = printer.run(client.stream(ids, generation_config_from_args(args)))
    print(result.metrics.summary() + (f" [{result.finish_reason}]" if result.finish_reason != "stop" else ""),
          file=sys.stderr)
    if result.detail:
        print(f"edgespec: {result.detail}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.metrics.to_dict()))
    return 0 if result.finish_reason != "link_lost" else 3
