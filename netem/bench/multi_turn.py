"""Time to first token of a chat's second turn, with and without the server's prefix cache (issue 27).

    python -m edgespec.netem.bench.multi_turn --questions 2 --turn1-tokens 32 --turn2-tokens 4   # a quick look
    python -m edgespec.netem.bench.multi_turn --questions 80 --turn1-tokens 256 --out runs/multi_turn.jsonl

Spec-Bench's 80 MT-Bench questions (two user turns each). For each question, as a chat user does: turn one
(the first user message) is answered, then turn two (first message, that answer, second message) is sent,
and its time to first token is measured at the client: request sent to first token received, through a
relay that applies a network profile (5g by default) to both ports. Greedy, so both settings see the same
text; the run checks that turn two's answers are equal with and without the cache.

Systems (--systems): ``plain`` is the server's plain API (/v1/chat/completions, streamed, as an openai
client sends it); a drafter name (ngram, independent, ...) is a speculative client (one EdgespecClient
for every request, as `edgespec client serve` runs them). Every (system, cache setting) pair gets a
fresh server process, so no system reads another's cached prefixes: ``off`` is the server with
``--prefix-cache-gb 0`` (every turn prefills its whole history), ``on`` the one with the cache.

Prints a Markdown table per system (turn-two prompt tokens and how many came from the cache, TTFT of both
turns, and the ratio of turn two's TTFT without the cache to with it); --out appends one JSON line per turn.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from edgespec.shared.models.registry import DEFAULT_DRAFTER, DEFAULT_TARGET
from .loopback import patient_link, relayed
from .records import markdown_table, sse_chunks
from .server_process import ServerProcess
from .specbench_format import MT_BENCH, QUESTIONS


@dataclass
class Turn:
    """One measured request."""

    system: str  # "plain" or a drafter name
    cache: str  # "on" or "off"
    question: int  # Spec-Bench question_id
    turn: int  # 1 or 2
    prompt_tokens: int
    cached_tokens: int  # prompt tokens the server restored from its prefix cache
    ttft_s: float  # request sent to first token received, at the client
    wall_s: float
    text: str


def mt_bench_questions(path: Path, limit: int) -> list[dict]:
    """The first `limit` MT-Bench questions of Spec-Bench's question file, in file order."""
    if not path.exists():
        raise SystemExit(f"no Spec-Bench question file at {path} (--questions-file)")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    picked = [r for r in rows if r.get("category") in MT_BENCH and len(r.get("turns", ())) == 2]
    if not picked:
        raise SystemExit(f"{path} holds no two-turn MT-Bench question")
    return picked[:limit]


def chat_plain(http: str, messages: list[dict], max_tokens: int) -> tuple[float, float, str, int]:
    """One streamed chat completion: (TTFT, wall, text, prompt tokens). The first chunk comes with the first token."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    text, usage, first = [], {}, None
    start = time.perf_counter()
    for chunk in sse_chunks(f"http://{http}/v1/chat/completions", body, timeout=1200):
        if first is None and chunk.get("choices"):
            first = time.perf_counter() - start
        for choice in chunk.get("choices", ()):
            text.append(choice.get("delta", {}).get("content") or "")
        usage = chunk.get("usage") or usage
    return first or 0.0, time.perf_counter() - start, "".join(text), usage.get("prompt_tokens", 0)


def chat_speculative(client, messages: list[dict], max_tokens: int) -> tuple[float, float, str, int]:
    """One generation through the speculative client: (TTFT, wall, text, prompt tokens)."""
    from edgespec.client import GenerationConfig, TokenEvent

    start = time.perf_counter()
    ids = client.encode_chat(messages)  # as `client serve` does per request: tokenizing counts
    first = None
    for event in client.stream(ids, GenerationConfig(max_new_tokens=max_tokens)):
        if first is None and isinstance(event, TokenEvent):
            first = time.perf_counter() - start
    result = event  # the stream's last item
    return first or 0.0, time.perf_counter() - start, client.decode(result.token_ids), len(ids)


def cache_hits(http: str) -> float:
    """The server's edgespec:prefix_cache_hits counter (read directly, not through the relay)."""
    import httpx

    for line in httpx.get(f"http://{http}/metrics", timeout=30).text.splitlines():
        if line.startswith("edgespec:prefix_cache_hits_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def run_system(args, system: str, cache: str, questions: list[dict]) -> list[Turn]:
    server_args = ["--dtype", args.dtype, "--prefix-cache-gb", str(args.prefix_cache_gb if cache == "on" else 0),
                   "--max-sessions", "8"]
    turns: list[Turn] = []
    with ServerProcess(args.model, server_args, threads=args.server_threads) as server:
        address = server.http_address if system == "plain" else server.grpc_address
        with relayed(address, None if args.profile == "none" else args.profile, seed=args.seed) as (target, _), \
                contextlib.nullcontext() if system == "plain" else _client(system, target, args) as client:
            ask = (functools.partial(chat_plain, target) if client is None
                   else functools.partial(chat_speculative, client))
            # One unmeasured request first: a process's first forwards are slow (allocations, kernels chosen).
            ask([{"role": "user", "content": "Hello"}], 2)
            for q in questions:
                history: list[dict] = []
                for index, (message, budget) in enumerate(zip(q["turns"], (args.turn1_tokens, args.turn2_tokens))):
                    history.append({"role": "user", "content": message})
                    before = cache_hits(server.http_address)
                    ttft, wall, text, prompt_tokens = ask(history, budget)
                    cached = int(cache_hits(server.http_address) - before)
                    history.append({"role": "assistant", "content": text})
                    turns.append(Turn(system, cache, q["question_id"], index + 1, prompt_tokens, cached, ttft,
                                      wall, text))
                    print(f"  {system} cache {cache} q{q['question_id']} turn {index + 1}: {prompt_tokens} prompt "
                          f"tokens ({cached} cached), TTFT {ttft * 1000:.0f} ms", flush=True)
    return turns


def _client(drafter: str, address: str, args):
    from edgespec.client import ClientConfig, DrafterOptions, EdgespecClient

    options = DrafterOptions(name=drafter, model=args.drafter_model, target=args.model)
    return EdgespecClient(ClientConfig(patient_link(address), options, tokenizer=args.model))


def summary(turns: list[Turn], systems: list[str]) -> str:
    lines = []
    header = ["system", "prefix cache", "questions", "turn-2 prompt tokens", "turn-2 cached tokens",
              "TTFT turn 1 (ms, mean)", "TTFT turn 2 (ms, mean)", "TTFT turn 2 (ms, median)"]
    rows = []
    for system in systems:
        mean2 = {}
        for cache in ("off", "on"):
            one = [t for t in turns if (t.system, t.cache, t.turn) == (system, cache, 1)]
            two = [t for t in turns if (t.system, t.cache, t.turn) == (system, cache, 2)]
            if not two:
                continue
            mean2[cache] = statistics.mean(t.ttft_s for t in two)
            rows.append([system, cache, len(two), f"{statistics.mean(t.prompt_tokens for t in two):.0f}",
                         f"{statistics.mean(t.cached_tokens for t in two):.0f}",
                         f"{statistics.mean(t.ttft_s for t in one) * 1000:.0f}", f"{mean2[cache] * 1000:.0f}",
                         f"{statistics.median(t.ttft_s for t in two) * 1000:.0f}"])
        if len(mean2) == 2 and mean2["on"] > 0:
            off = {t.question: t.text for t in turns if (t.system, t.cache, t.turn) == (system, "off", 2)}
            same = sum(off.get(t.question) == t.text for t in turns if (t.system, t.cache, t.turn) == (system, "on", 2))
            lines.append(f"- {system}: turn-2 TTFT {mean2['off'] / mean2['on']:.2f}x lower with the prefix cache; "
                         f"turn-2 answers equal with and without it: {same}/{len(off)}")
    return markdown_table(header, rows) + "\n\n" + "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options (``edgespec bench``'s micro-benchmark interface: add_arguments, run)."""
    p.add_argument("--model", default=DEFAULT_TARGET, help="target (registry name or directory)")
    p.add_argument("--drafter-model", default=DEFAULT_DRAFTER, help="small model of the independent drafter")
    p.add_argument("--systems", default="plain,ngram", help="comma-separated: plain and/or drafter names")
    p.add_argument("--questions", type=int, default=80, help="first N MT-Bench questions of Spec-Bench")
    p.add_argument("--questions-file", type=Path, default=None,
                   help="Spec-Bench's question.jsonl (default: the copy shipped in the package)")
    p.add_argument("--turn1-tokens", type=int, default=256, help="most tokens of turn one's answer")
    p.add_argument("--turn2-tokens", type=int, default=16, help="most tokens of turn two's answer (only its first "
                                                                "token is timed)")
    p.add_argument("--profile", default="5g", help="network profile of the relay in front of the server (none: "
                                                   "direct)")
    p.add_argument("--dtype", default="float32", help="the server's dtype (float32: the fast one on a CPU "
                                                      "without native bf16)")
    p.add_argument("--prefix-cache-gb", type=float, default=2.0, help="the server's cache budget in the 'on' runs")
    p.add_argument("--server-threads", type=int, default=None, help="torch threads of the server (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="the relay's seed")
    p.add_argument("--out", type=Path, default=None, help="append one JSON line per turn here")


def run(args: argparse.Namespace) -> int:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    questions = mt_bench_questions(args.questions_file or QUESTIONS, args.questions)
    turns: list[Turn] = []
    for system in systems:
        for cache in ("off", "on"):
            got = run_system(args, system, cache, questions)
            turns += got
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                with open(args.out, "a") as f:
                    for t in got:
                        f.write(json.dumps({**t.__dict__, "profile": args.profile, "model": args.model}) + "\n")
    print(f"\n## Turn-2 time to first token, {args.model} ({args.dtype}), {len(questions)} MT-Bench questions "
          f"(Spec-Bench), {args.profile} link\n")
    print(summary(turns, systems))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgespec.netem.bench.multi_turn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
