"""Micro-benchmark of the independent drafter: one pass, and whole trees against the target's greedy text.

    edgespec bench independent --configs bf16:0:3x12x24@0.05,int8:0:3x12x24@0.05:int8 --threads 1

1. Pass cost: the drafter's decoder over 1 and over 3 (a frontier) new tokens
   after a real prompt, the full LM head and a reduced one, in bf16 and fp32.
2. Trees: for each prompt the target's own greedy continuation is computed once;
   then, for each config NAME:VOCAB:BxDxM@min_prob, the drafter proposes trees and
   the longest path agreeing with that continuation is accepted (the target's
   greedy verification), plus the target's next token as the bonus. Reported per
   config: drafting time per tree, drafter passes per tree, tau (tokens committed
   per verification) and drafting time per committed token; with the target's
   measured cost of verifying a tree of that size, an estimate of tokens/s.
   Configs run back to back on every prompt, so a busy CPU slows them alike.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from dataclasses import dataclass

from .prompt_sets import add_prompt_arguments, chosen_prompts
from .tree_sweep import parse_shape


@dataclass(frozen=True)
class BenchConfig:
    name: str  # label in the table
    vocab: int  # reduced draft vocabulary size (0 = full)
    shape: object  # EAGLE-2 tree shape (client.drafters.tree_builder.TreeShape)
    weights: str = "bf16"  # "bf16" (as loaded), "int8" (weight-only int8 Linear layers) or "int4-mlp" (the MLP's
    # int4, the rest int8: the drafter's default)


@dataclass
class Tally:
    trees: int = 0
    passes: int = 0
    draft_s: float = 0.0
    committed: int = 0  # tokens committed (accepted + bonus)
    nodes: int = 0


def parse_config(text: str) -> BenchConfig:
    try:
        name, vocab, shape, *weights = text.split(":")
        if weights and weights[0] not in ("bf16", *QUANTIZED):
            raise ValueError(f"weights must be bf16, {' or '.join(QUANTIZED)}, not {weights[0]!r}")
        return BenchConfig(name, int(vocab), parse_shape(shape), *weights)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"config {text!r} is not NAME:VOCAB:BxDxM@min_prob[:bf16|int8|int4-mlp] ({err})") from None


def accepted_length(tree, continuation: list[int]) -> int:
    """Longest root path of tree equal to the start of continuation (greedy verification: the target's best
    token after a node of depth d is continuation[d])."""
    from edgespec.shared.verification import greedy_walk

    best = [continuation[d] if d < len(continuation) else -1 for d in (0, *tree.depths())]
    return len(greedy_walk(tree, best).accepted)


def greedy_continuation(model, ids: list[int], max_new: int, eos: set[int]) -> list[int]:
    import torch
    from transformers import DynamicCache

    from edgespec.shared.kv import with_cache

    cache, out, feed, pos = DynamicCache(), [], list(ids), 0
    with torch.inference_mode():
        for _ in range(max_new):
            logits = model(input_ids=torch.tensor([feed]), position_ids=torch.arange(pos, pos + len(feed))[None],
                           use_cache=True, logits_to_keep=1, **with_cache(model, cache)).logits[0, -1]
            pos += len(feed)
            out.append(int(logits.argmax()))
            if out[-1] in eos:
                break
            feed = [out[-1]]
    return out


def verify_cost(model, ids: list[int], nodes: int, repeats: int = 3) -> float:
    """Median seconds of a target forward over `nodes` + 1 tokens after ids (a tree verification's size)."""
    import torch
    from transformers import DynamicCache

    from edgespec.shared.kv import with_cache

    cache = DynamicCache()
    times = []
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), use_cache=True, **with_cache(model, cache), logits_to_keep=1)
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(input_ids=torch.tensor([ids[-nodes - 1:]]), use_cache=True, **with_cache(model, cache))
            times.append(time.perf_counter() - t0)
            cache.crop(-(nodes + 1))
    return statistics.median(times)


def pass_costs(model, ids: list[int], vocab_ids, repeats: int = 5) -> dict[str, float]:
    """Median ms of the decoder over 1 and 3 tokens after ids, and of the full and reduced LM head
    (vocab_ids: the reduced head's rows, a tensor, or None for the full head)."""
    import torch
    from transformers import DynamicCache

    from edgespec.shared.kv import with_cache

    from edgespec.client import head_rows

    with torch.inference_mode():
        body, head = model.get_decoder(), model.get_output_embeddings()
        reduced = head_rows(head, vocab_ids)
        cache = DynamicCache()
        body(input_ids=torch.tensor([ids]), use_cache=True, **with_cache(body, cache))
        out = {}
        for k in (1, 3):
            t_body, t_full, t_red = [], [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                h = body(input_ids=torch.tensor([ids[-k:]]), use_cache=True,
                         **with_cache(body, cache)).last_hidden_state[0]
                t1 = time.perf_counter()
                head(h)
                t2 = time.perf_counter()
                reduced(h)
                t3 = time.perf_counter()
                cache.crop(-k)
                t_body.append(t1 - t0), t_full.append(t2 - t1), t_red.append(t3 - t2)
            out[f"body x{k}"] = 1000 * statistics.median(t_body)
            out[f"full head x{k}"] = 1000 * statistics.median(t_full)
            out[f"reduced head x{k}"] = 1000 * statistics.median(t_red)
    return out


QUANTIZED = ("int8", "int4-mlp")  # IndependentConfig.weights names this benchmark compares with bf16


def quantized_model(model, weights: str):
    """A copy of model with the weight-only low-bit Linear layers `weights` names (as from_pretrained makes)."""
    from edgespec.client import IndependentConfig, quantize, weights_config

    copied = copy.deepcopy(model)
    quantize(copied, IndependentConfig(prefill_float=False, **weights_config(weights)))
    return copied


def run_trees(drafter, prompt: list[int], continuation: list[int], tally: Tally) -> None:
    """Draft against the target's greedy continuation until it is used up."""
    from edgespec.client import DraftRequest
    from edgespec.shared.wire import MAX_NODES

    calls = [0]
    inner = drafter._hidden

    def counted(*a, **k):
        calls[0] += 1
        return inner(*a, **k)

    drafter._hidden = counted
    try:
        committed, done = list(prompt) + continuation[:1], 1
        while done < len(continuation):
            calls[0] = 0
            t0 = time.perf_counter()
            tree = drafter.propose(DraftRequest(tuple(committed), MAX_NODES, len(continuation) - done))
            dt = time.perf_counter() - t0
            n = accepted_length(tree, continuation[done:]) if len(tree) else 0
            step = continuation[done:done + n + 1]
            committed += step
            done += len(step)
            tally.trees += 1
            tally.passes += calls[0]
            tally.draft_s += dt
            tally.committed += len(step)
            tally.nodes += len(tree)
    finally:
        drafter._hidden = inner
        drafter.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", default="bf16:0:3x12x24@0.05,v32k:32768:3x12x24@0.05,int8:0:3x12x24@0.05:int8",
                   help="comma-separated NAME:VOCAB:BxDxM@min_prob[:bf16|int8|int4-mlp]")
    add_prompt_arguments(p, humaneval=2, mtbench=2, max_tokens=48)
    p.add_argument("--skip-pass", action="store_true", help="skip the per-pass dtype/head timings")
    p.add_argument("--skip-trees", action="store_true", help="skip the tree runs (no target needed)")


def run(args: argparse.Namespace) -> int:
    import torch

    from edgespec.client import IndependentConfig, IndependentDrafter, chat_prompt_ids, draft_vocab_ids, eos_ids
    from edgespec.shared.models import load_model
    configs = [parse_config(c) for c in args.configs.split(",") if c]
    small = load_model(args.drafter_model, device="cpu")
    vocab_size = small.model.get_output_embeddings().weight.shape[0]
    vocabs = {c.vocab: draft_vocab_ids(small.tokenizer, small.fingerprint, c.vocab, vocab_size) for c in configs}
    prompt_ids = [chat_prompt_ids(small.tokenizer, pr.messages()) for pr in chosen_prompts(args)]
    print(f"# independent drafter micro-benchmark ({torch.get_num_threads()} threads)")
    if not args.skip_pass:
        reduced = next((v for v in vocabs.values() if v is not None), None)
        print(f"\n| weights | {' | '.join(pass_costs(small.model, prompt_ids[0], reduced, 1))} |  (ms, median; "
              f"reduced head: {0 if reduced is None else len(reduced)} ids)")
        for label, model in (("bf16", small.model), ("int8 (bf16 activations)", quantized_model(small.model, "int8")),
                             ("int4 MLP, int8 rest", quantized_model(small.model, "int4-mlp")),
                             ("fp32", copy.deepcopy(small.model).float())):
            costs = pass_costs(model, prompt_ids[0], reduced)
            print(f"| {label} | " + " | ".join(f"{v:.1f}" for v in costs.values()) + " |", flush=True)
    if args.skip_trees:
        return 0
    target = load_model(args.target, device="cpu")
    eos = eos_ids(target.tokenizer)
    continuations = []
    for ids in prompt_ids:
        t0 = time.perf_counter()
        continuations.append(greedy_continuation(target.model, ids, args.max_tokens, eos))
        print(f"target greedy: {len(continuations[-1])} tokens in {time.perf_counter() - t0:.1f}s", file=sys.stderr,
              flush=True)
    tallies = {c.name: Tally() for c in configs}
    models = {"bf16": small.model}
    models.update({w: quantized_model(small.model, w) for w in {c.weights for c in configs} if w in QUANTIZED})
    drafters = {c.name: IndependentDrafter(models[c.weights], IndependentConfig(c.shape, c.vocab), vocabs[c.vocab])
                for c in configs}
    run_trees(drafters[configs[0].name], prompt_ids[0][:32], continuations[0][:4], Tally())  # warm-up
    for ids, cont in zip(prompt_ids, continuations):
        for c in configs:
            run_trees(drafters[c.name], ids, cont, tallies[c.name])
    print("\n| config | weights | vocab | B | D | M | min_prob | draft ms/tree | passes/tree | tau | draft ms/token | "
          "verify ms/call | est. tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        t = tallies[c.name]
        tau = t.committed / t.trees
        verify = verify_cost(target.model, prompt_ids[0], max(1, round(t.nodes / t.trees)))
        est = t.committed / (t.draft_s + t.trees * verify)
        print(f"| {c.name} | {c.weights} | {c.vocab or 'full'} | {c.shape.branch} | {c.shape.depth} | {c.shape.max_nodes} | "
              f"{c.shape.min_prob} | {1000 * t.draft_s / t.trees:.0f} | {t.passes / t.trees:.2f} | {tau:.2f} | "
              f"{1000 * t.draft_s / t.committed:.0f} | {1000 * verify:.0f} | {est:.2f} |", flush=True)
    return 0

