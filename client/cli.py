"""`edgespec client`: generate against a server from the terminal, or `edgespec client serve` the local API.

    edgespec client --server HOST:PORT --drafter ngram --prompt "Write quicksort in Python"
    echo "prompt" | edgespec client --server HOST:PORT --drafter independent
    edgespec client serve --server HOST:PORT --drafter independent --port 8000 --api-key LOCAL_KEY

As in vLLM, `client serve`'s --port, --host and --api-key are the local API's; the edgespec server's key
is --server-api-key (EDGESPEC_SERVER_API_KEY). --local-api-key is --api-key's old name.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from dataclasses import replace

from edgespec.shared import defaults
from edgespec.shared.config import add_on_first_use, comma_list, enable_layers
from edgespec.shared.config_flags import Flag, add_flags, from_args
from edgespec.shared.logging_setup import LEVELS

DEFAULT_SERVER = defaults.SERVER
DEFAULT_API_PORT = defaults.CLIENT_PORT  # `client serve`; the server's HTTP side takes 8080, so both fit on one machine

# Fields of the client's configs on the command line (shared/config_flags.py): type, default and help come from
# the field where the Flag does not say otherwise.
LINK_FLAGS = {  # LinkConfig's (client, serve, demo); its address is --server, or the demo's relay
    "tls": Flag(), "root_certificates": Flag("--ca"),
    "api_key": Flag("--server-api-key", help="API key the edgespec server asks for (EDGESPEC_SERVER_API_KEY keeps "
                                             "it out of the process list)"),
    "min_deadline_s": Flag(),
}
LOOP_GENERATION_FLAGS = {  # GenerationConfig's that the loop needs (client, serve, demo)
    "resume_policy": Flag("--policy", help="offline tokens on reconnect: rollback (exactly the target's text) or keep"),
    "offline_wait_s": Flag(),
}
RUN_GENERATION_FLAGS = {  # GenerationConfig's for one prompt (client); serve's come with each request
    "max_new_tokens": Flag("--max-tokens", default=defaults.MAX_TOKENS), "stop": Flag(default=None),
    "sampling.temperature": Flag(default=defaults.TEMPERATURE),
    "seed": Flag(default=defaults.SEED, help="the sampling seed, in [0, 2**64) (unset: a fresh one for each prompt)"),
}


def vocab_count(text: str) -> int:
    """--draft-vocab's N (and a bench system's "~N"): a count of ids, "65536" or "64k"; 0 or "full" for all."""
    if text == "full":
        return 0
    try:
        count = int(text[:-1]) * 1024 if text.endswith("k") else int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ids (65536 or 64k; 0 or full drafts over "
                                         "the whole vocabulary)")
    return count


def add_client_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `client`, `client serve` and `demo` (link, drafter, tree), added once the command is
    used: LinkConfig and GenerationConfig, whose fields some of them are, live in modules that import torch."""
    add_on_first_use(p, _add_client_options)


def _add_client_options(p: argparse.ArgumentParser) -> None:
    from .link.grpc_transport import LinkConfig
    from .loop.generation import GenerationConfig

    # Tree and ngram defaults stay None here and come from TreeShape / NgramConfig when the client is built.
    p.add_argument("--drafter", default=defaults.DRAFTER,
                   help="ngram | independent | eagle | moa | beagle | a shipped learned drafter: eagle, moa-tli0, "
                        "moa-tli1 | NAME+ngram (e.g. eagle+ngram) merges prompt lookup's continuations into NAME's "
                        "trees")
    p.add_argument("--drafter-model", default=None,
                   help="small LM of the independent drafter (registry name or directory; "
                        "default qwen2.5-coder-0.5b-instruct)")
    # drafters.independent.WEIGHTS, spelled out so that building the parser loads no torch
    p.add_argument("--drafter-weights", default=None, choices=("int4-mlp", "int8", "float"),
                   help="independent drafter on a CPU in 16 bits: its MLP int4 and the rest int8 (default), all "
                        "int8, or as loaded")
    p.add_argument("--draft-vocab", type=vocab_count, default=None, metavar="N",
                   help="independent and learned drafters: draft over the N most frequent ids of the tokenizer (a "
                        "shipped list; 0 = the whole vocabulary; a learned drafter with an LM-head router keeps its "
                        "router's list unless this is given; default: 64k)")
    p.add_argument("--context-vocab", action=argparse.BooleanOptionalAction, default=None,
                   help="independent and learned drafters with a reduced --draft-vocab: also draft the ids of the "
                        "prompt and the answer so far that the list lacks (default: on)")
    p.add_argument("--checkpoint", default=None,
                   help="learned drafter (eagle, moa, beagle): a shipped name or a checkpoint folder/file of your own")
    p.add_argument("--no-router", action="store_true",
                   help="learned drafters: ignore the checkpoint's LM-head router (compute the full head)")
    p.add_argument("--target-model", default=None,
                   help="learned drafters: the target whose embedding, norm and LM head (and TLI layers) they use, "
                        "read from its files on this machine (default: the server's model)")
    p.add_argument("--moa-server-part", default=None,
                   help="MoA: the server part's name on the server (default: the checkpoint's name)")
    p.add_argument("--tokenizer", default=None, help="the target's tokenizer (model name or directory); "
                                                      "default: the drafter's model or the server's model name")
    add_tree_arguments(p)
    add_loop_arguments(p)
    p.add_argument("--ngram-nodes", type=int, default=None,
                   help="nodes in an ngram tree (default: 24), and the most a NAME+ngram lookup adds (default: 8)")
    add_flags(p, GenerationConfig, LOOP_GENERATION_FLAGS)
    add_flags(p, LinkConfig, LINK_FLAGS)


def add_loop_arguments(p: argparse.ArgumentParser) -> None:
    """How the loop sizes its trees and whether it drafts while a verification is out (client, serve, demo)."""
    p.add_argument("--tree", choices=["auto", "fixed"], default="auto",
                   help="auto: size each step's tree (or none) for the most tokens per second from the measured "
                        "round trip, the server's cost curve and the drafter's acceptance, within the shape the "
                        "--tree-* flags give; fixed: that shape every step")
    p.add_argument("--no-pipeline", action="store_true",
                   help="the serial loop: draft only after each verdict (default: draft the next tree while the "
                        "server verifies, from the likeliest verdict)")
    p.add_argument("--decode-ahead", type=decode_ahead_count, default=None, metavar="N",
                   help="most tokens a step without a tree asks the server to decode on its own, so a round trip "
                        "is not paid per token while trees lose (1: one token a step; default: 8)")


def decode_ahead_count(text: str) -> int:
    """--decode-ahead's value: a whole number of tokens from 1 to the wire's limit."""
    from edgespec.shared.wire import MAX_DECODE_AHEAD

    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_DECODE_AHEAD:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of tokens from 1 to {MAX_DECODE_AHEAD}")
    return int(text)


def loop_config(args: argparse.Namespace):
    from .loop.planner import LoopConfig

    ahead = LoopConfig.decode_ahead if args.decode_ahead is None else args.decode_ahead
    return LoopConfig(pipeline=not args.no_pipeline, tree=args.tree, decode_ahead=ahead)


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    """The EAGLE-2 tree shape (also the drafting benchmarks')."""
    p.add_argument("--tree-branch", type=int, default=None,
                   help="EAGLE-2 B: children per expanded node (default: 2)")
    p.add_argument("--tree-depth", type=int, default=None, help="EAGLE-2 D: deepest level drafted (default: 12)")
    p.add_argument("--tree-nodes", type=int, default=None, help="EAGLE-2 M: nodes kept in a tree (default: 16)")
    p.add_argument("--tree-min-prob", type=float, default=None,
                   help="stop deepening once the best path's probability is below this (default: 0.2)")


def tree_shape(args: argparse.Namespace):
    """The TreeShape the tree arguments ask for; it is written back into args, so a run records the
    shape it used."""
    from .drafters.tree_builder import TreeShape

    fields = {"tree_branch": "branch", "tree_depth": "depth", "tree_nodes": "max_nodes", "tree_min_prob": "min_prob"}
    tree = TreeShape(**{name: getattr(args, arg) for arg, name in fields.items() if getattr(args, arg) is not None})
    for arg, name in fields.items():
        setattr(args, arg, getattr(tree, name))
    return tree


def link_config(args, address: str):
    """The LinkConfig the link flags give, for the server at `address`."""
    from .link.grpc_transport import LinkConfig

    return from_args(LinkConfig, args, LINK_FLAGS, address=address,
                     max_deadline_s=max(LinkConfig.max_deadline_s, args.min_deadline))


def drafter_options_from_args(args):
    """The DrafterOptions the drafter and tree flags give."""
    from .drafters.factory import DrafterOptions
    from .drafters.ngram import NgramConfig
    from .drafters.with_lookup import MERGED_LOOKUP
    from edgespec.shared.models.registry import DEFAULT_DRAFTER

    ngram = NgramConfig() if args.ngram_nodes is None else NgramConfig(max_nodes=args.ngram_nodes)
    lookup = MERGED_LOOKUP if args.ngram_nodes is None else replace(MERGED_LOOKUP, max_nodes=args.ngram_nodes)
    return DrafterOptions(name=args.drafter, model=args.drafter_model or DEFAULT_DRAFTER,
                          checkpoint=args.checkpoint, target=args.target_model,
                          moa_server_part=args.moa_server_part, tree=tree_shape(args), ngram=ngram, lookup=lookup,
                          router=not args.no_router, weights=args.drafter_weights,
                          draft_vocab=args.draft_vocab, context_vocab=args.context_vocab)


def client_from_args(args, link):
    """The EdgespecClient the drafter, tree and loop flags give, over `link` (a LinkConfig)."""
    from .edge_client import ClientConfig, EdgespecClient

    return EdgespecClient(ClientConfig(link, drafter_options_from_args(args), tokenizer=args.tokenizer,
                                       loop=loop_config(args)))


def generation_config_from_args(args, flags=None, **given):
    """GenerationConfig from the generation flags (a run's and the loop's unless `flags` says which)."""
    from .loop.generation import GenerationConfig

    flags = flags or {**LOOP_GENERATION_FLAGS, **RUN_GENERATION_FLAGS}
    if "seed" in flags and getattr(args, "seed", None) is None:
        given.setdefault("seed", defaults.fresh_seed())  # unset: a fresh seed, as the HTTP APIs draw one
    return from_args(GenerationConfig, args, flags, **given)


SERVE_DOC = """`edgespec client serve`: an OpenAI-compatible API on this machine, drafting here and verifying on the server.

    edgespec client serve --server HOST:PORT --port 8000
    edgespec client serve --server HOST:PORT --drafter ngram --api-key LOCAL_KEY

As in vLLM, --host, --port and --api-key are the local API's; the edgespec server's key is --server-api-key
(EDGESPEC_SERVER_API_KEY). Sampling and max_tokens come with each request.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("client", help="generate with a remote verifier (or `client serve` a local API)",
                              description=__doc__, add_help=False)
    p.add_argument("-h", "--help", action=_ClientHelp,
                   help="show this help message and exit (`edgespec client serve --help`: serve's)")
    p.add_argument("action", nargs="?", choices=["run", "serve"], default="run",
                   help="run (default): generate for --prompt or stdin; serve: OpenAI-compatible local API")
    p.set_defaults(func=main)
    add_on_first_use(p, _add_command_options)


class _ClientHelp(argparse._HelpAction):
    """`edgespec client --help` shows the command's options; `edgespec client serve --help` only serve's."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, "action", None) == "serve":
            print(serve_parser().format_help(), end="")
        else:
            parser.print_help()
        parser.exit()


def serve_parser() -> argparse.ArgumentParser:
    """The options `client serve` reads, alone: what `edgespec client serve --help` shows."""
    from edgespec.shared.config import LayeredParser

    p = LayeredParser(prog="edgespec client serve", description=SERVE_DOC)
    _add_common_options(p)
    _add_serve_options(p)
    enable_layers(p)
    return p


def _add_command_options(p: argparse.ArgumentParser) -> None:
    _add_common_options(p)
    _add_run_options(p)
    _add_serve_options(p)
    enable_layers(p)


def _add_common_options(p: argparse.ArgumentParser) -> None:
    """What `client` and `client serve` both read: the server, the drafter, trees, the loop, the link, logs."""
    from .link.grpc_transport import LinkConfig

    add_flags(p, LinkConfig, {"address": Flag("--server", default=DEFAULT_SERVER)})
    _add_client_options(p)
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="log lines as text or one JSON object a line (time, level, logger, message, "
                        "extra fields; no progress bars) on stderr")
    p.add_argument("--log-level", choices=LEVELS, default="info", help="least severe level logged")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """What only `client` (run) reads: the prompt, its sampling, the terminal."""
    from .loop.generation import GenerationConfig

    p.add_argument("--prompt", default=None, help="the prompt (unset: read stdin)")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    add_flags(p, GenerationConfig, RUN_GENERATION_FLAGS)
    p.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="colour tokens by origin: green accepted draft, plain target, yellow offline")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON on the last line")


def _add_serve_options(p: argparse.ArgumentParser) -> None:
    """What only `client serve` reads: the local API."""
    p.add_argument("--host", default="127.0.0.1", help="serve: interface of the local API")
    p.add_argument("--port", type=int, default=DEFAULT_API_PORT, help="serve: port of the local API")
    p.add_argument("--api-key", "--local-api-key", dest="api_key", default=None,
                   help="serve: require this key from callers of the local API, as vLLM's --api-key "
                        "(EDGESPEC_API_KEY keeps it out of the process list; --local-api-key is its old name); the "
                        "edgespec server's key is --server-api-key")
    p.add_argument("--metrics-need-key", action="store_true", help="serve: /metrics asks for --api-key too")
    p.add_argument("--allowed-origins", action="append", default=[], metavar="ORIGIN[,ORIGIN]",
                   help="serve: CORS origins browser pages may call the local API from (* for any); repeatable or "
                        "comma-separated; unset: no cross-origin calls")
    p.add_argument("--enable-log-requests", action="store_true",
                   help="serve: log every request as it is accepted: id, sizes, sampling (never the prompt's text)")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="serve: largest request body, MiB (413 past it)")


def run_only_flags_given(argv: list[str]) -> list[str]:
    """The options only `client` (run) reads that a `client serve` command line gives (serve would ignore them)."""
    probe = argparse.ArgumentParser(add_help=False)
    _add_run_options(probe)
    run_only = {s for action in probe._actions for s in action.option_strings}
    given = []
    for token in argv:
        name = token.split("=", 1)[0]
        if name in run_only and name not in given:
            given.append(name)
    return given


def main(args) -> int:
    if args.action == "serve":
        given = run_only_flags_given(getattr(args, "argv", []))
        if given:
            print(f"edgespec client serve: error: {', '.join(given)} {'is' if len(given) == 1 else 'are'} read by "
                  "`edgespec client` (one prompt) only; `client serve` takes sampling and max_tokens with each "
                  "request (see `edgespec client serve --help`)", file=sys.stderr)
            return 2
        return serve(args)
    if args.api_key:
        logging.getLogger("edgespec.client").warning(
            "--api-key (EDGESPEC_API_KEY) is the local API's key (`client serve`, as vLLM's) and is not sent to the "
            "server; give the edgespec server's key as --server-api-key (EDGESPEC_SERVER_API_KEY)")
    with client_from_args(args, link_config(args, args.server)) as client:
        return run_prompt(client, args)


def local_api(args):
    """(the slot the client loads into in the background, the local API's app); the client and /health's probe of
    the server share one LinkConfig."""
    from .http_api import build_app
    from .http_health import ClientSlot
    from .metrics import ClientMetrics

    metrics = ClientMetrics()  # /metrics; every generation feeds it once the client has loaded
    link = link_config(args, args.server)

    def load():
        client = client_from_args(args, link)
        client.metrics, metrics.model_name = metrics, client.model_name
        return client

    if args.api_key and not args.server_api_key:
        logging.getLogger("edgespec.client.serve").info(
            "--api-key guards the local API (as vLLM's); it is not sent to the edgespec server: if the server "
            "asks for a key, give it as --server-api-key (EDGESPEC_SERVER_API_KEY)")
    slot = ClientSlot.load_in_background(load, args.drafter, link)
    loop = generation_config_from_args(args, LOOP_GENERATION_FLAGS)
    app = build_app(slot, policy=loop.resume_policy, offline_wait_s=loop.offline_wait_s, api_key=args.api_key,
                    metrics=metrics, metrics_need_key=args.metrics_need_key,
                    max_body_bytes=int(args.max_body_mb * (1 << 20)), allowed_origins=comma_list(args.allowed_origins),
                    log_requests=args.enable_log_requests)
    return slot, app


def serve(args) -> int:
    """The local API: the port answers at once (/health says 503 "loading") while the client loads."""
    import uvicorn

    slot, app = local_api(args)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                                           log_level=None))  # logging is configured above, not by uvicorn
    logging.getLogger("edgespec.client.serve").info(
        "local API starting; /health answers 503 until the client has loaded", extra={
            "host": args.host, "port": args.port, "drafter": args.drafter, "server": args.server})
    threading.Thread(target=announce_when_ready, args=(slot, server, args), daemon=True).start()
    try:
        server.run()
    finally:
        slot.close()
    return 0 if slot.status != "failed" else 1


def announce_when_ready(slot, server, args) -> None:
    """Print the ready line once the port listens and the client has loaded (scripts wait for it).

    A load that failed for good (wrong tokenizer, unknown drafter, missing model) stops the service: it
    was logged with its reason, and an orchestrator should see the exit rather than a port that only
    ever answers 503."""
    slot.wait_settled()
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if slot.client is None:
        server.should_exit = True
        return
    print(f"edgespec local API on http://{args.host}:{args.port}/v1 (model {slot.client.model_name}, "
          f"drafter {slot.drafter})", flush=True)


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
