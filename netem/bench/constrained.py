"""Acceptance length under a grammar: tau constrained against unconstrained, on the same prompts.

    edgespec bench constrained --humaneval 10 --mtbench 10 --max-tokens 128

Two tasks a coding agent asks of a code model, each on its own prompt set:
- json: a HumanEval function described as a JSON object (response_format json_schema);
- tool: an MT-Bench first turn with two tools rendered by the chat template and tool_choice "required".
Each prompt is generated greedily three ways, back to back, through a real verifier (the target in this
process, no sockets: tau does not depend on the link):
- free: no grammar (the same prompt; the model answers as it likes);
- server: the target's verification is constrained, the drafter drafts freely;
- grammar: both, the drafter drafting inside the grammar (what both APIs do).
Reported per task and way: tau (tokens committed per verification, bonus included), verifications, tokens,
draft and verify time per tree, the share of outputs that parse, and tau against the free way's.
The goal: the grammar way's tau within 20 % of the free way's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

from edgespec.shared.metrics import GenerationMetrics
from .prompt_sets import add_prompt_arguments, humaneval_prompts, mtbench_first_turns

JSON_INSTRUCTION = ("Describe the following Python function as a JSON object with the keys \"name\", "
                    "\"parameters\" (a list of objects with \"name\" and \"type\"), \"returns\" and \"summary\" "
                    "(one sentence). Answer with the JSON only.\n```python\n{prompt}```")
FUNCTION_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"},
    "parameters": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "type": {"type": "string"}}, "required": ["name", "type"],
        "additionalProperties": False}},
    "returns": {"type": "string"},
    "summary": {"type": "string", "maxLength": 300}},
    "required": ["name", "parameters", "returns", "summary"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "web_search", "description": "Search the web",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                     "required": ["query"]}}},
    {"type": "function", "function": {"name": "run_python", "description": "Run Python code and return stdout",
                                      "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                     "required": ["code"]}}},
]
WAYS = ("free", "server", "grammar")


@dataclass(frozen=True)
class Task:
    kind: str  # "json" or "tool"
    id: str  # the prompt's id
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    grammar: str


@dataclass
class Tally:
    total: GenerationMetrics = field(default_factory=GenerationMetrics)  # the generations' metrics, summed
    parsed: int = 0  # outputs that parse as the task asks
    outputs: int = 0
    per_prompt_tau: list[float] = field(default_factory=list)


def tasks(args, tokenizer) -> list[Task]:
    from edgespec.shared.grammar import json_schema_grammar
    from edgespec.shared.openai.tool_calls import tool_use

    out = []
    schema_grammar = json_schema_grammar(FUNCTION_SCHEMA)
    for p in humaneval_prompts(args.humaneval) if args.humaneval else []:
        message = {"role": "user", "content": JSON_INSTRUCTION.format(prompt=p.problem["prompt"])}
        out.append(Task("json", p.id, (message,), None, schema_grammar))
    tool_grammar = tool_use(TOOLS, "required", True).grammar_for(tokenizer)
    for p in mtbench_first_turns(args.mtbench) if args.mtbench else []:
        out.append(Task("tool", p.id, tuple(p.messages()), tuple(TOOLS), tool_grammar))
    return out


def parses(task: Task, text: str) -> bool:
    from edgespec.shared.openai.tool_calls import parse_tool_calls

    if task.kind == "tool":
        return bool(parse_tool_calls(text)[1])
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_prompt_arguments(p, humaneval=4, mtbench=4, max_tokens=96)
    p.add_argument("--drafter", default="independent", help="drafter kind (default independent: the small model)")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")


def run(args: argparse.Namespace) -> int:
    import torch

    from edgespec.client import (DrafterOptions, Generation, GenerationConfig, InProcessTransport, TokenizerInfo,
                                 Verifier, make_drafter)
    from edgespec.server import CoreLimits, TargetModel, VerifierCore, VerifierServicer
    from edgespec.shared.grammar import grammar_tokenizer
    from edgespec.shared.models import load_model

    ways = [w for w in args.ways.split(",") if w]
    if not set(ways) <= set(WAYS):
        args.parser.error(f"--ways takes {', '.join(WAYS)}, got {args.ways}")
    target = TargetModel(load_model(args.target, device="cpu"))
    core = VerifierCore(target, CoreLimits())
    tok = target.tokenizer
    drafter = make_drafter(DrafterOptions(name=args.drafter, model=args.drafter_model))
    llg = grammar_tokenizer(tok, target.vocab_size, target.eos_ids)
    chosen = tasks(args, tok)
    print(f"# tau under a grammar: {len(chosen)} prompts, {args.max_tokens} tokens, drafter {args.drafter}, "
          f"{torch.get_num_threads()} threads")
    tallies = {(t.kind, w): Tally() for t in chosen for w in ways}
    servicer = VerifierServicer(core)
    try:
        for task in chosen:
            text = tok.apply_chat_template(list(task.messages), tools=list(task.tools) if task.tools else None,
                                           tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            for way in ways:
                info = TokenizerInfo(target.fingerprint, set(target.eos_ids), lambda t: tok.decode(list(t)),
                                     (lambda: llg) if way == "grammar" else None)
                config = GenerationConfig(max_new_tokens=args.max_tokens, grammar="" if way == "free" else task.grammar)
                t0 = time.perf_counter()
                result = Generation(Verifier(InProcessTransport(servicer)), drafter, ids, config, info).run()
                m, tally = result.metrics, tallies[(task.kind, way)]
                tally.total.add(m)
                tally.outputs += 1
                answer = tok.decode([t for t in result.token_ids if t not in target.eos_ids])
                tally.parsed += parses(task, answer)
                tally.per_prompt_tau.append(m.acceptance_length)
                print(f"{task.kind:4} {task.id:14} {way:7} tau {m.acceptance_length:5.2f}  {m.new_tokens:4} tokens "
                      f"{time.perf_counter() - t0:6.1f}s", file=sys.stderr, flush=True)
    finally:
        core.close_all()
    print()
    print("| task | way | tau | tau / free | verifications | tokens | draft ms/tree | verify ms/tree | parses |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in dict.fromkeys(t.kind for t in chosen):
        free = tallies.get((kind, "free"))
        for way in ways:
            t = tallies[(kind, way)]
            m, tau = t.total, t.total.mean_acceptance_length  # 1 + accepted tokens per tree
            ratio = f"{tau / free.total.mean_acceptance_length:.2f}" if free and free.total.num_drafts else "-"
            per_tree = (lambda s: f"{1000 * s / m.num_drafts:.0f}") if m.num_drafts else (lambda s: "-")
            print(f"| {kind} | {way} | {tau:.2f} (median {statistics.median(t.per_prompt_tau):.2f}) | {ratio} | "
                  f"{m.num_drafts} | {m.new_tokens} | {per_tree(m.draft_s)} | {per_tree(m.verify_s)} | "
                  f"{t.parsed}/{t.outputs} |")
    return 0

