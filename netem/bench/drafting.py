"""Benchmark: edgespec's drafters against plain decoding and transformers' own assisted generation.

    edgespec bench drafting --humaneval 20 --mtbench 20 --max-tokens 128

All methods run in one process, one prompt at a time and every method on each
prompt back to back (so a busy machine slows them alike), greedy, same prompts,
same end-of-text tokens:

- target: the target's own greedy decoding (``generate``): the baseline and the reference output
- hf-assisted: transformers' assisted generation with the small model (``assistant_model=``)
- hf-lookup: transformers' prompt lookup decoding (``prompt_lookup_num_tokens=``)
- ngram, independent, eagle, moa-tli0, moa-tli1: the edgespec client against an edgespec server
  on loopback (an ideal link); learned drafters by shipped checkpoint name (``--checkpoints``
  points elsewhere), the server holding their MoA server parts; any of them but ngram (and any
  ``--learned`` NAME) also as NAME+ngram, prompt lookup merged into its trees

Reported per method: tokens/s (new tokens over wall time, prefill included),
speed-up over the target, and tau = tokens committed per target forward pass
(prefill counted, the same definition for every method), and whether the output
equals the target's own (losslessness check). For edgespec's drafters also the bytes
crossing the link per accepted draft token: as sent (activations int8 + zstd) and with the
activations as plain float16 ("raw").
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from edgespec.client import add_tree_arguments, tree_shape
from edgespec.shared.metrics import GenerationMetrics
from .prompt_sets import add_prompt_arguments, chosen_prompts
from .records import markdown_table

EDGESPEC = ("ngram", "independent", "eagle", "moa-tli0", "moa-tli1")  # drafter names, built by the factory
METHODS = ("target", "hf-assisted", "hf-lookup", *EDGESPEC)


@dataclass
class Run:
    method: str
    prompt_id: str
    new_tokens: int
    seconds: float
    target_forwards: int  # target forward passes (prefill included)
    exact: bool  # output equals the target's own greedy output
    metrics: GenerationMetrics | None = None  # the edgespec client's, for its drafters


class ForwardCounter:
    """Counts forward passes of a module (the target) with a hook."""

    def __init__(self, module):  # a torch.nn.Module
        self.count = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


def hf_generate(model, ids: list[int], max_new: int, eos: list[int], pad: int, counter: ForwardCounter,
                **kwargs) -> tuple[list[int], float, int]:
    """Greedy generate() with the given extras; (new ids, seconds, target forwards)."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad,
                              repetition_penalty=1.0, temperature=None, top_p=None, top_k=None)
    counter.count = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             generation_config=config, **kwargs)
    return out[0, len(ids):].tolist(), time.perf_counter() - t0, counter.count


def summarize(runs: list[Run]) -> dict:
    """Per method: tokens/s, speed-up over target, tau, exact matches; for edgespec's drafters also
    drafting time per tree, per-position acceptance and bytes per accepted token."""
    out = {}
    base = None
    seen = list(dict.fromkeys(r.method for r in runs))
    # the built-in methods in their fixed order, then any others (learned drafters) as they first ran
    for method in [m for m in METHODS if m in seen] + [m for m in seen if m not in METHODS]:
        rs = [r for r in runs if r.method == method]
        tokens, seconds, forwards = (sum(r.new_tokens for r in rs), sum(r.seconds for r in rs),
                                     sum(r.target_forwards for r in rs))
        tps = tokens / seconds if seconds else 0.0
        if method == "target":
            base = tps
        row = {"prompts": len(rs), "new_tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tps, 2),
               "tau": round(tokens / forwards, 3) if forwards else 0.0,
               "exact": f"{sum(r.exact for r in rs)}/{len(rs)}"}
        if base:
            row["speedup"] = round(tps / base, 3)
        if any(r.metrics for r in rs):  # an edgespec client ran it
            total = GenerationMetrics()
            for r in rs:
                total.add(r.metrics)
            drafts, accepted = total.num_drafts, total.num_accepted_tokens
            row["tau_vllm"] = round(total.mean_acceptance_length, 3)  # 1 + accepted / drafts
            row["draft_s"] = round(total.draft_s, 2)
            row["verify_s"] = round(total.verify_s, 2)
            row["draft_ms_per_tree"] = round(1000 * total.draft_s / drafts, 1) if drafts else None
            row["own_draft_ms_per_tree"] = round(1000 * total.own_draft_s / drafts, 1) if drafts else None
            # accept@k: the share of trees whose k-th drafted token was accepted
            row["accept_at"] = [round(a / drafts, 3) for a in total.accepted_per_position] if drafts else []
            sent = total.bytes_up + total.bytes_down
            raw = sent - total.feature_bytes + total.feature_raw_bytes
            row["bytes_per_accepted"] = round(sent / accepted, 1) if accepted else None
            row["raw_bytes_per_accepted"] = round(raw / accepted, 1) if accepted else None
        out[method] = row
    return out


def table(summary: dict) -> str:
    rows = []
    for method, row in summary.items():
        sent, raw = row.get("bytes_per_accepted"), row.get("raw_bytes_per_accepted")
        at, ms, own = row.get("accept_at"), row.get("draft_ms_per_tree"), row.get("own_draft_ms_per_tree")
        rows.append([method, f"{row['tokens_per_s']:.2f}", f"{row.get('speedup', 1.0):.2f}x", f"{row['tau']:.2f}",
                     "-" if at is None else " / ".join(f"{a:.2f}" for a in (at + [0.0, 0.0, 0.0])[:3]),
                     "-" if ms is None else f"{own:.0f} / {ms:.0f}", row["exact"],
                     f"{sent:,.0f} / {raw:,.0f}" if sent else "-"])
    return markdown_table(["method", "tokens/s", "speed-up", "tau (tokens per target forward)", "accept@1 / @2 / @3",
                           "drafting ms per tree (its own / with missed guesses)", "output = target's",
                           "bytes per accepted token (sent / raw fp16)"], rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_prompt_arguments(p, humaneval=20, mtbench=20, max_tokens=128)
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for hf-lookup")
    add_tree_arguments(p)
    p.add_argument("--checkpoints", default=None,
                   help="folder with learned drafter checkpoints named like the methods (default: the shipped ones)")
    p.add_argument("--learned", action="append", default=[], metavar="NAME=PATH[:no-router][:float32]",
                   help="also run a learned drafter of your own (any recipe: eagle, moa, beagle, with or without its "
                        "LM-head router) under NAME, e.g. eagle-hass=runs/fit8/eagle-hass; repeatable")
    p.add_argument("--out", default=None, help="write every run and the summary as JSON here")


def recorded(args: argparse.Namespace) -> dict:
    """The benchmark's own arguments, as a run's JSON keeps them (not the command line's handler and parser)."""
    return {a.dest: getattr(args, a.dest) for a in args.parser._actions if a.dest != "help"}


def run(args: argparse.Namespace) -> int:
    import torch

    p = args.parser
    try:
        learned = parse_learned(args.learned)
    except ValueError as exc:
        p.error(str(exc))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] + list(learned)
    unknown = {m for m in methods if m not in METHODS and m not in learned and not with_lookup(m, learned)}
    if unknown:
        p.error(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)} (an edgespec drafter but ngram "
                f"also as NAME+ngram)")
    tree = tree_shape(args)
    # every prompt's runs as they finish: an interrupted hour-long run keeps what it measured
    with open(args.out + ".partial.jsonl", "w") if args.out else contextlib.nullcontext() as partial:
        runs = run_benchmark(args.target, args.drafter_model, chosen_prompts(args), args.max_tokens, methods, tree,
                             args.lookup_tokens, args.checkpoints, learned, partial)
    summary = summarize(runs)
    print(f"\n{args.humaneval} HumanEval + {args.mtbench} MT-Bench prompts, {args.max_tokens} new tokens at most, "
          f"greedy, {torch.get_num_threads()} threads, tree B={tree.branch} D={tree.depth} M={tree.max_nodes} "
          f"min_prob={tree.min_prob}")
    print(table(summary))
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": recorded(args), "summary": summary, "runs": [asdict(r) for r in runs]}, f, indent=1)
    return 0


LEARNED_SUFFIXES = ("no-router", "float32", "bfloat16")  # NAME=PATH[:no-router][:float32|:bfloat16]


def parse_learned(pairs: list[str]) -> dict[str, tuple[str, bool, str | None]]:
    """``NAME=PATH[:no-router][:float32|:bfloat16]`` -> {NAME: (PATH, use_router, dtype)}; no dtype: the client's
    default (bf16 where the CPU has it natively, else float32)."""
    out: dict[str, tuple[str, bool, str | None]] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--learned takes NAME=PATH[:no-router][:float32|:bfloat16], got {pair!r}")
        if name in METHODS or name in out:
            raise ValueError(f"--learned name {name!r} is taken; choose another")
        given = set()
        while (tail := path.rpartition(":"))[1] and tail[2] in LEARNED_SUFFIXES:
            given.add(tail[2])
            path = tail[0]
        if {"float32", "bfloat16"} <= given:
            raise ValueError(f"--learned {pair!r} asks for two dtypes")
        dtype = next((d for d in ("float32", "bfloat16") if d in given), None)
        out[name] = (path, "no-router" not in given, dtype)
    return out


def with_lookup(method: str, learned: dict) -> bool:
    """Whether ``method`` is an edgespec drafter (not ngram) or a ``--learned`` one, with +ngram."""
    from edgespec.client import split_lookup

    base, lookup = split_lookup(method)
    return lookup and base != "ngram" and (base in EDGESPEC or base in learned)


def method_options(method: str, target: str, drafter_model: str, tree, checkpoints: str | None,
                   learned: dict[str, tuple[str, bool]]):
    """The DrafterOptions of an edgespec method: a drafter's name (a learned one from ``--checkpoints`` when
    given) or a ``--learned`` NAME=PATH of its kind; a MoA drafter's server part is named after the method;
    METHOD+ngram: METHOD's options with prompt lookup merged into its trees."""
    from dataclasses import replace

    from edgespec.client import BUILTIN, LOOKUP_SUFFIX, DrafterOptions, split_lookup
    from edgespec.shared.drafters.checkpoint import checkpoint_kind, resolve_checkpoint

    base, lookup = split_lookup(method)
    if lookup:
        options = method_options(base, target, drafter_model, tree, checkpoints, learned)
        return replace(options, name=options.name + LOOKUP_SUFFIX)
    if method in BUILTIN:
        return DrafterOptions(method, model=drafter_model, tree=tree)
    path, router, dtype = learned.get(method, (method if checkpoints is None else str(Path(checkpoints, method)),
                                               True, None))
    name = checkpoint_kind(resolve_checkpoint(path)) if method in learned else method
    return DrafterOptions(name, checkpoint=path, target=target, tree=tree, router=router, dtype=dtype,
                          moa_server_part=method if name.startswith("moa") else None)


def edgespec_clients(stack: contextlib.ExitStack, target: str, options: dict, small, tokenizer) -> dict:
    """{method: EdgespecClient} for {method: DrafterOptions}, each drafter built by the factory (the
    independent one on the already loaded ``small`` model), against a loopback server holding their MoA
    server parts; closed with ``stack``."""
    from edgespec.client import ClientConfig, EdgespecClient
    from .loopback import loopback_server, patient_link

    if not options:
        return {}
    moa = {o.moa_server_part: o.checkpoint for o in options.values() if o.moa_server_part}
    link = patient_link(stack.enter_context(loopback_server(target, moa_server_parts=moa)).address)
    clients = {}
    for m, o in options.items():
        clients[m] = EdgespecClient(ClientConfig(link, o), tokenizer=tokenizer, small_model=small.model)
        stack.callback(clients[m].link.close)
        assert o.name != m or clients[m].drafter.name == m, (clients[m].drafter.name, m)
    return clients


def run_benchmark(target_name: str, drafter_name: str, prompts: list, max_new: int,
                  methods: list[str], tree, lookup_tokens: int, checkpoints: str | None = None,
                  learned: dict[str, tuple[str, bool]] | None = None, partial=None) -> list[Run]:
    from edgespec.client import GenerationConfig, chat_prompt_ids, eos_ids
    from edgespec.shared.models import load_model

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    learned = learned or {}
    options = {m: method_options(m, target_name, drafter_name, tree, checkpoints, learned)
               for m in [m for m in EDGESPEC if m in methods] + [m for m in methods if with_lookup(m, learned)]
               + list(learned)}
    log(f"loading {target_name} and {drafter_name} ...")
    target = load_model(target_name, device="cpu")
    small = load_model(drafter_name, device="cpu")
    tok = target.tokenizer
    eos = sorted(eos_ids(tok))
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    hf_methods = {m: extras for m, extras in {"hf-assisted": {"assistant_model": small.model},
                                              "hf-lookup": {"prompt_lookup_num_tokens": lookup_tokens}}.items()
                  if m in methods}
    with contextlib.ExitStack() as stack:
        counter = ForwardCounter(target.model)
        stack.callback(counter.close)
        clients = edgespec_clients(stack, target_name, options, small, tok)
        greedy = functools.partial(hf_generate, target.model, eos=eos, pad=pad, counter=counter)
        # warm up every path once (first calls allocate and pick kernels) on a throwaway prompt
        warm = chat_prompt_ids(tok, [{"role": "user", "content": "Say hello."}])
        for extras in [{}, *hf_methods.values()]:
            greedy(warm, 4, **extras)
        for client in clients.values():
            client.generate(warm, GenerationConfig(max_new_tokens=4))
        runs: list[Run] = []
        for n, prompt in enumerate(prompts):
            done = prompt_runs(prompt, chat_prompt_ids(tok, prompt.messages()), max_new, "target" in methods,
                               greedy, hf_methods, clients)
            runs += done
            if partial is not None:
                partial.writelines(json.dumps(asdict(r)) + "\n" for r in done)
                partial.flush()
            log(f"[{n + 1}/{len(prompts)}] {prompt.id}: " + ", ".join(
                f"{r.method} {r.new_tokens / r.seconds:.1f} tok/s tau {r.new_tokens / max(1, r.target_forwards):.2f}"
                + ("" if r.exact else " (differs)") for r in done))
    return runs


def prompt_runs(prompt, ids: list[int], max_new: int, with_target: bool, greedy: Callable, hf_methods: dict,
                clients: dict) -> list[Run]:
    """One prompt through every method back to back; the target's own greedy output (``greedy``: hf_generate
    of the target) is the reference."""
    from edgespec.client import GenerationConfig

    ref, secs, fw = greedy(ids, max_new)
    runs = [Run("target", prompt.id, len(ref), secs, fw, True)] if with_target else []
    for method, extras in hf_methods.items():
        out, secs, fw = greedy(ids, max_new, **extras)
        runs.append(Run(method, prompt.id, len(out), secs, fw, out == ref))
    for method, client in clients.items():
        result = client.generate(ids, GenerationConfig(max_new_tokens=max_new))
        m = result.metrics
        runs.append(Run(method, prompt.id, m.new_tokens, m.wall_s, m.calls, result.token_ids == ref, m))
    return runs
