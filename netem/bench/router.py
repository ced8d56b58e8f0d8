"""Benchmark: what CORAL's LM-head router saves in drafting time and costs in acceptance.

    edgespec bench router --checkpoint runs/eagle-router --humaneval 10 --mtbench 10

One drafter checkpoint with a ``router.safetensors`` beside it, one runtime, the router
attached or not; every prompt is generated both ways back to back (alternating which goes
first, so a busy machine slows both alike), greedy, through a real server on loopback with
the same tree settings. Reported for each: drafting time per tree (the client's
``draft_s`` over trees), tau (tokens committed per verification, bonus included),
per-position acceptance (accepted drafts at depth k per tree), tokens/s, and whether both
outputs are the same (they must be: verification is lossless either way). Apart from that,
the LM head alone: milliseconds per call for 1 and ``branch`` rows (LM-head inputs recorded
while drafting), full vs routed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit
from pathlib import Path

from edgespec.client import add_tree_arguments, tree_shape
from .prompt_sets import add_prompt_arguments, chosen_prompts
from .records import markdown_table

MODES = ("full head", "router")


def mode_summary(m) -> dict:
    """One mode's figures from its generations' summed GenerationMetrics."""
    trees = max(1, m.num_drafts)
    return {"trees": m.num_drafts, "draft_ms_per_tree": 1000 * m.draft_s / trees, "tau": m.acceptance_length,
            "accept_rate_at": [a / trees for a in m.accepted_per_position], "tokens_per_s": m.tokens_per_s}


def recording(routed):
    """The same routed head (sharing its group-ordered weight), keeping the first LM-head inputs it
    is asked about: real drafting rows for the head's own timing."""
    from edgespec.shared.drafters.router import RoutedHead

    class RecordingHead(RoutedHead):
        def __init__(self, inner: RoutedHead):
            self.__dict__.update(inner.__dict__)
            self.rows: list = []  # torch.Tensor rows

        def logits(self, hidden):
            if len(self.rows) < 64:
                self.rows.append(hidden.detach().clone())
            return super().logits(hidden)

    return RecordingHead(routed)


def time_call(fn, repeat: int) -> float:
    """Median milliseconds of fn() over ``repeat`` calls (after one warm-up call)."""
    fn()
    return 1000 * statistics.median_high(timeit.repeat(fn, repeat=repeat, number=1))


def head_timings(parts, routed, rows, sizes: tuple[int, ...], repeat: int) -> dict[int, tuple]:
    """{rows per call: (full ms, routed ms)} of the LM head alone on real LM-head inputs (rows: a tensor)."""
    import torch

    out = {}
    with torch.inference_mode():
        for t in sizes:
            h = rows[:t]
            full = time_call(lambda: torch.log_softmax(parts.logits(h).float(), -1), repeat)
            out[t] = (full, time_call(lambda: routed.logprobs(h), repeat))
    return out


def table(s: dict[str, dict], heads: dict[int, tuple], same: str) -> str:
    full, routed = s[MODES[0]], s[MODES[1]]
    depth = max(len(full["accept_rate_at"]), len(routed["accept_rate_at"]))
    at = lambda m, k: m["accept_rate_at"][k] if k < len(m["accept_rate_at"]) else 0.0  # noqa: E731
    pairs = ([("drafting ms per tree", full["draft_ms_per_tree"], routed["draft_ms_per_tree"], ".2f")]
             + [(f"LM head ms per call, {t} row(s)", a, b, ".3f") for t, (a, b) in heads.items()]
             + [("tau (tokens per verification)", full["tau"], routed["tau"], ".3f")]
             + [(f"accepted at depth {k + 1} per tree", at(full, k), at(routed, k), ".3f") for k in range(depth)]
             + [("tokens/s", full["tokens_per_s"], routed["tokens_per_s"], ".2f")])
    rows = [[label, format(a, spec), format(b, spec), f"{a / b:.2f}x" if b else "-"]
            for label, a, b, spec in pairs]
    return markdown_table([None, "full head", "router", "full / router"], rows + [["same output both ways", same, None, None]])


def open_routed_drafter(checkpoint: str, target: str, tree):
    """(LearnedDrafter, RoutedHead, checkpoint path, MoA server part or None) for a checkpoint with a router."""
    from edgespec.client import DrafterOptions, make_drafter
    from edgespec.shared.drafters.checkpoint import (DrafterCheckpointError, checkpoint_kind, find_checkpoint,
                                               resolve_checkpoint)
    from edgespec.shared.drafters.router import router_path

    ckpt = find_checkpoint(resolve_checkpoint(checkpoint))
    if not router_path(ckpt).is_file():
        raise DrafterCheckpointError(f"no router.safetensors beside {ckpt}: train one with `edgespec train fit "
                                     f"--kind eagle+router --init RUN` (or moa+router)")
    part = None if ckpt.is_file() else ckpt.name
    drafter = make_drafter(DrafterOptions(checkpoint_kind(ckpt), checkpoint=str(ckpt), target=target, tree=tree,
                                          moa_server_part=part))
    return drafter, drafter.rt.routed, ckpt, part


def measure(args: argparse.Namespace) -> dict:
    """Every prompt both ways, then the LM head alone; the figures as run() prints and writes them."""
    import torch

    from edgespec.client import (ClientConfig, DrafterOptions, EdgespecClient, GenerationConfig, chat_prompt_ids,
                                 load_tokenizer)
    from edgespec.shared.metrics import GenerationMetrics
    from .loopback import loopback_server, patient_link
    tree = tree_shape(args)
    drafter, routed, ckpt, moa_part = open_routed_drafter(args.checkpoint, args.target, tree)
    routed = recording(routed)
    messages = [p.messages() for p in chosen_prompts(args)] + [[{"role": "user", "content": t}] for t in args.prompt]
    if not messages:
        raise SystemExit("no prompts: give --humaneval N, --mtbench N or --prompt TEXT")
    with loopback_server(args.target, dtype=args.dtype,
                         moa_server_parts={moa_part: str(ckpt)} if moa_part else {}) as server:
        tok = load_tokenizer(args.target)
        with EdgespecClient(ClientConfig(patient_link(server.address), DrafterOptions(drafter.name.split("-")[0])),
                            tokenizer=tok, drafter=drafter) as client:
            config = GenerationConfig(max_new_tokens=args.max_tokens)
            totals = {m: GenerationMetrics() for m in MODES}
            same = 0
            for i, msgs in enumerate(messages):
                ids = chat_prompt_ids(tok, msgs)
                outputs = {}
                for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                    drafter.rt.attach_router(routed if mode == "router" else None)
                    if i == 0:  # warm-up: first calls allocate and pick kernels
                        client.generate(ids, GenerationConfig(max_new_tokens=4))
                    result = client.generate(ids, config)
                    totals[mode].add(result.metrics)
                    outputs[mode] = result.token_ids
                same += outputs[MODES[0]] == outputs[MODES[1]]
                print(f"[{i + 1}/{len(messages)}] " + ", ".join(
                    f"{m}: {mode_summary(t)['draft_ms_per_tree']:.1f} ms/tree, tau {t.acceptance_length:.2f}"
                    for m, t in totals.items()), file=sys.stderr, flush=True)
            rows = torch.cat(routed.rows)  # LM-head inputs met while drafting: the head's timing runs on them
            heads = head_timings(drafter.rt.parts, routed, rows, (1, min(tree.branch, rows.shape[0])), args.head_repeat)
    summary = {m: mode_summary(t) for m, t in totals.items()}
    return {"checkpoint": str(ckpt), "prompts": len(messages), "router": routed.router.config.__dict__,
            "summary": summary, "head_ms": {str(t): list(v) for t, v in heads.items()},
            "same_output": f"{same}/{len(messages)}"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="drafter checkpoint (file, folder or run) with router.safetensors")
    add_prompt_arguments(p, humaneval=5, mtbench=5, max_tokens=128, drafter_model=False)
    p.add_argument("--dtype", default=None, help="the server's target dtype (default bfloat16)")
    p.add_argument("--prompt", action="append", default=[], help="an extra user message (repeatable)")
    add_tree_arguments(p)
    p.add_argument("--head-repeat", type=int, default=50, help="calls per LM-head timing (median kept)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")


def run(args: argparse.Namespace) -> int:
    import torch

    report = measure(args)
    r = report["router"]
    print(f"\n{report['prompts']} prompts, {args.max_tokens} new tokens at most, greedy, {torch.get_num_threads()} "
          f"threads; router: {r['n_groups']} groups ({r['split']}), top {r['top_g']} computed; tree "
          f"B={args.tree_branch} D={args.tree_depth} M={args.tree_nodes} min_prob={args.tree_min_prob}")
    heads = {int(k): tuple(v) for k, v in report["head_ms"].items()}
    print(table(report["summary"], heads, report["same_output"]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0

