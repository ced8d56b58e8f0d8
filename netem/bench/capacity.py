"""How many users one server holds: N sessions of drafted trees against N plain-API streams, same server.

    edgespec bench capacity --target qwen2.5-coder-1.5b-instruct --sessions 1,4,16,64 --profile 5g

Every session is a real client (gRPC over its own relay with the profile's delays and bandwidth) whose
drafter is the oracle (``oracle_drafter``): it knows the target's greedy continuation, asked of the same
server's plain API, and hangs trees of ``--nodes`` nodes whose accepted length follows a histogram a real
drafter reached on Spec-Bench (``--accept``: ``independent-0.5b``, ``ngram``, or ``fixedN``). Drafting
costs nothing, so what is measured is the server and the link. The baseline is N streams of the server's
own plain API, each over its own relay with the same profile, in the same run. All sessions start
together and generate ``--max-tokens`` tokens (EOS ignored, so every one is as long).

Reported per N and system: committed tokens/s in all and per session (mean and the slowest), time per
token and round trip (median and p99 over sessions), the engine's steps, mean batch and forward time per
committed token (from the server's /metrics), the nodes a tree held (the client's planner shrinks trees as
the server's published load price rises; the oracle drafts what it is asked, at most ``--nodes``), and
the sessions that left the continuation (bf16 ties). The
capacity at a per-session rate (``--rate``) is the largest N whose slowest session keeps it. With sessions
behind a 5G round trip a server is mostly idle at small N: throughput ratios there are the link's, not the
server's capacity.

``--check-with ngram`` (or ``independent``) adds, at each N, real clients drafting with that drafter, then
the oracle replaying the accepted lengths they reached: where the two agree, the oracle's figures stand for
that drafter's (the real one also pays its drafting time, which the oracle does not).

Sessions run in ``--client-processes`` processes (threads inside each), so that many clients' Python does
not queue on one interpreter lock; the server runs in this process.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from threading import Barrier, Thread

from edgespec.shared.models.registry import DEFAULT_DRAFTER
from .prompt_sets import add_prompt_arguments, chosen_prompts


@dataclass(frozen=True)
class SessionJob:
    """One session's work, picklable for a client process."""

    index: int
    prompt_ids: tuple[int, ...]
    continuation: tuple[int, ...]


@dataclass(frozen=True)
class RunSpec:
    """What every session of one run shares."""

    grpc_address: str
    http_address: str
    tokenizer: str  # the target's model name or folder (the client's tokenizer must be the server's)
    profile: str | None  # network profile of every session's own relay; None: direct
    accept: str  # accepted-length histogram name
    nodes: int
    depth: int
    max_tokens: int
    vocab_size: int
    start_at: float  # time.time() at which every session starts
    drafter: str = "oracle"  # or a client drafter's name (ngram, independent): real drafting, for the check
    drafter_model: str = ""  # independent's small model
    counts: tuple[tuple[int, int], ...] = ()  # the oracle's histogram as (accepted, count) pairs; (): ``accept``


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="server device: cpu, cuda:0, ... (default: CUDA when present)")
    p.add_argument("--dtype", default=None, help="server dtype (default: bf16 on a GPU, as the server's own)")
    p.add_argument("--server-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a further `edgespec server` setting as KEY=VALUE, e.g. engine=batched (repeatable)")
    p.add_argument("--sessions", default="1,4,16", help="comma-separated session counts N (default: 1,4,16)")
    p.add_argument("--profile", default="5g", help="network profile of every session's own relay; none: direct")
    p.add_argument("--accept", default="independent-0.5b",
                   help="accepted lengths: a shipped histogram (independent-0.5b, ngram) or fixedN")
    p.add_argument("--nodes", type=int, default=16, help="nodes per oracle tree")
    p.add_argument("--depth", type=int, default=12, help="levels of the oracle tree's chain (12: the client's default tree)")
    p.add_argument("--rate", type=float, default=20.0, help="per-session tokens/s a session must keep for capacity")
    p.add_argument("--client-processes", type=int, default=0,
                   help="processes the sessions run in (0: one per 16 sessions, at most the cores less one)")
    p.add_argument("--no-plain", action="store_true", help="skip the plain-API baseline")
    p.add_argument("--check-with", default=None, metavar="DRAFTER",
                   help="also run real clients with this drafter (ngram, independent) at each N, then the oracle "
                        "replaying the accepted lengths they reached: the check that the oracle's figures hold")
    p.add_argument("--drafter-model", default=None, help="--check-with independent: its small model (default: the "
                   "default drafter)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="start no further N once this many seconds have gone (0: every N): a GPU check's time box")
    p.add_argument("--out", type=Path, default=None,
                   help="also write capacity.jsonl (one line per N and system), report.md and tokens_per_s.png here")
    add_prompt_arguments(p, humaneval=4, mtbench=4, max_tokens=64, drafter_model=False)


def run(args: argparse.Namespace) -> int:
    from edgespec.netem.bench.oracle_drafter import histogram
    from edgespec.server import ServerConfig, start_server

    histogram(args.accept)  # refuse a bad name before loading anything
    counts = [int(n) for n in args.sessions.split(",") if n.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit(f"--sessions needs positive counts, got {args.sessions!r}")
    model = args.target
    settings = dict(kv.split("=", 1) for kv in args.server_arg)
    server = start_server(ServerConfig(model=model, device=args.device, dtype=args.dtype, **_typed(settings)))
    try:
        rows = measure(server, model, args, counts)
    finally:
        server.stop(grace=1.0)
    text = report(rows, args.rate)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "capacity.jsonl").open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        command = " ".join(["edgespec", *sys.argv[1:]]).replace(str(args.out), "OUT")  # as a reader would type it
        (args.out / "report.md").write_text(f"`{command}`\n\n{text}")
        plot(rows, args.out / "tokens_per_s.png")
    return 0


def plot(rows: list[dict], path: Path) -> None:
    """Committed tokens/s in all against N, one line per system (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = [r for r in rows if r["system"] == system]
        ax.plot([r["sessions"] for r in mine], [r["tokens_per_s"] for r in mine], marker="o", label=system)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sessions (N)")
    ax.set_ylabel("committed tokens/s, all sessions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measure(server, model: str, args: argparse.Namespace, counts: list[int]) -> list[dict]:
    """One line per (N, system): the figures of the module's docstring."""
    http = server.http_url.removeprefix("http://")
    from edgespec.client import chat_prompt_ids

    prompts = [tuple(chat_prompt_ids(server.core.target.tokenizer, p.messages())) for p in chosen_prompts(args)]
    if not prompts:
        raise SystemExit("no prompts: give --humaneval or --mtbench a count above 0")
    conts = [greedy_ids(http, p, args.max_tokens) for p in prompts]
    profile = None if args.profile == "none" else args.profile
    rows = []
    t0 = time.monotonic()
    for n in counts:
        if args.budget_s and time.monotonic() - t0 > args.budget_s:
            print(f"N={n} and above not started: the {args.budget_s:g} s budget is spent", file=sys.stderr)
            break
        jobs = [SessionJob(i, prompts[i % len(prompts)], conts[i % len(prompts)]) for i in range(n)]
        spec = RunSpec(server.address, http, model, profile, args.accept, args.nodes, args.depth, args.max_tokens,
                       server.core.target.vocab_size, 0.0)
        procs = args.client_processes or max(1, min(math.ceil(n / 16), (_cores() or 2) - 1))
        if args.check_with:
            real = replace(spec, drafter=args.check_with, drafter_model=args.drafter_model or DEFAULT_DRAFTER)
            rows.append(measured(args.check_with, real, jobs, procs, spec_sessions, http, args))
            replay = replace(spec, counts=tuple(enumerate(rows[-1].pop("drafts_by_accepted"))))
            rows.append(measured(f"oracle~{args.check_with}", replay, jobs, procs, spec_sessions, http, args))
        rows.append(measured("speculative", spec, jobs, procs, spec_sessions, http, args))
        if not args.no_plain:
            rows.append(measured("plain-api", spec, jobs, procs, plain_sessions, http, args))
    for r in rows:
        r.pop("drafts_by_accepted", None)
    return rows


def measured(system: str, spec: RunSpec, jobs: list[SessionJob], procs: int, body, http: str,
             args: argparse.Namespace) -> dict:
    """One run of ``body``'s sessions, summed up as one line of the report."""
    before = engine_totals(http)
    sessions, wall = run_sessions(spec, jobs, procs, body)
    row = summary(system, len(jobs), sessions, wall, engine_totals(http).minus(before), args)
    print(_line(row), file=sys.stderr, flush=True)
    return row


def _typed(settings: dict[str, str]) -> dict:
    """KEY=VALUE strings as ServerConfig's field types (ints, floats, booleans; the rest stay strings)."""
    out = {}
    for k, v in settings.items():
        low = v.lower()
        if low in ("true", "false"):
            out[k] = low == "true"
        else:
            for cast in (int, float):
                try:
                    out[k] = cast(v)
                    break
                except ValueError:
                    continue
            else:
                out[k] = v
    return out


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def greedy_ids(http_address: str, prompt_ids: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    """The target's greedy continuation, as ids, from the plain API (return_tokens_as_token_ids)."""
    import httpx

    reply = httpx.post(f"http://{http_address}/v1/completions", timeout=600,
                       json={"prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0, "logprobs": 0,
                             "ignore_eos": True, "return_tokens_as_token_ids": True})
    reply.raise_for_status()
    return tuple(int(t.removeprefix("token_id:")) for t in reply.json()["choices"][0]["logprobs"]["tokens"])


# -- sessions, in client processes -----------------------------------------------------------------------

def run_sessions(spec: RunSpec, jobs: list[SessionJob], processes: int, body) -> tuple[list[dict], float]:
    """Run ``body(spec, jobs)`` over ``processes`` client processes, all sessions starting at one moment;
    (every session's figures, wall seconds from that moment to the last session's end)."""
    parts = [jobs[i::processes] for i in range(processes) if jobs[i::processes]]
    start_at = time.time() + 2.0 + 0.5 * len(parts)  # time for the processes to import and connect
    spec = RunSpec(**{**asdict(spec), "start_at": start_at})
    if len(parts) == 1:
        sessions = body(spec, parts[0])
    else:
        import multiprocessing

        with ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("spawn")) as pool:
            sessions = [s for got in pool.map(body, [spec] * len(parts), parts) for s in got]
    return sessions, max(s["end"] for s in sessions) - start_at


def _threads(spec: RunSpec, jobs: list[SessionJob], one) -> list[dict]:
    """``one(spec, job, ready)`` in a thread per job; each waits on the barrier, then for ``start_at``."""
    out: list[dict | BaseException] = [None] * len(jobs)  # type: ignore[list-item]
    ready = Barrier(len(jobs))

    def go(k: int, job: SessionJob) -> None:
        try:
            out[k] = one(spec, job, ready)
        except BaseException as exc:  # reported below, with the session it ended
            out[k] = exc
            ready.abort()

    threads = [Thread(target=go, args=(k, j), daemon=True) for k, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [(j.index, o) for j, o in zip(jobs, out) if isinstance(o, BaseException)]
    if failed:
        raise RuntimeError(f"session {failed[0][0]} failed: {failed[0][1]!r}") from failed[0][1]
    return out  # type: ignore[return-value]


def _relay(spec: RunSpec, upstream: str, seed: int):
    from .loopback import relayed

    return relayed(upstream, spec.profile, seed=seed)


def _wait(spec: RunSpec, ready: Barrier) -> None:
    ready.wait()
    time.sleep(max(0.0, spec.start_at - time.time()))


def spec_sessions(spec: RunSpec, jobs: list[SessionJob]) -> list[dict]:
    """A client process's speculative sessions: one EdgespecClient and relay each, the oracle drafting."""
    from edgespec.client import ClientConfig, DrafterOptions, EdgespecClient, GenerationConfig, load_tokenizer
    from edgespec.netem.bench.oracle_drafter import AcceptHistogram, OracleDrafter, histogram
    from .loopback import patient_link

    tokenizer = load_tokenizer(spec.tokenizer)
    accept = AcceptHistogram("measured", dict(spec.counts)) if spec.counts else histogram(spec.accept)
    oracle = spec.drafter == "oracle"
    small = None
    if spec.drafter == "independent":  # one small model for the process's sessions, as a benchmark shares it
        from edgespec.shared.models import load_model

        small = load_model(spec.drafter_model, device="cpu").model

    def one(spec: RunSpec, job: SessionJob, ready: Barrier) -> dict:
        drafter = OracleDrafter(job.prompt_ids, job.continuation, accept, spec.vocab_size, spec.nodes, spec.depth,
                                seed=job.index) if oracle else None
        options = DrafterOptions(spec.drafter if not oracle else "ngram",
                                 **({"model": spec.drafter_model} if spec.drafter_model else {}))
        with _relay(spec, spec.grpc_address, job.index) as (address, _):
            client = EdgespecClient(ClientConfig(patient_link(address), options), tokenizer=tokenizer,
                                    drafter=drafter, small_model=small)
            _wait(spec, ready)
            result = client.generate(list(job.prompt_ids),
                                     GenerationConfig(max_new_tokens=spec.max_tokens, ignore_eos=True))
            end = time.time()
            client.link.close()
        m = result.metrics
        return {"session": job.index, "new_tokens": m.new_tokens, "end": end, "wall_s": m.wall_s,
                "calls": m.calls, "round_trip_s": m.mean_round_trip_s, "tau": m.acceptance_length,
                "accepted": m.num_accepted_tokens / m.num_drafts if m.num_drafts else 0.0,
                "tree_nodes": m.num_draft_tokens / m.num_drafts if m.num_drafts else 0.0,
                "asked": statistics.fmean(drafter.asked) if drafter and drafter.asked else 0.0,
                "diverged": drafter.diverged if drafter else 0, "drafts_by_accepted": m.drafts_by_accepted(),
                "exact": list(result.token_ids) == list(job.continuation)}

    return _threads(spec, jobs, one)


def plain_sessions(spec: RunSpec, jobs: list[SessionJob]) -> list[dict]:
    """A client process's plain-API streams: one streamed completion and relay each."""
    from .records import sse_chunks

    def one(spec: RunSpec, job: SessionJob, ready: Barrier) -> dict:
        with _relay(spec, spec.http_address, job.index) as (address, _):
            _wait(spec, ready)
            t0 = time.perf_counter()
            gaps, last, usage = [], t0, {}
            body = {"prompt": list(job.prompt_ids), "max_tokens": spec.max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            for chunk in sse_chunks(f"http://{address}/v1/completions", body, timeout=600):
                now = time.perf_counter()
                if chunk.get("choices"):
                    gaps.append(now - last)
                    last = now
                usage = chunk.get("usage") or usage
            end = time.time()
            wall = time.perf_counter() - t0
        tokens = usage.get("completion_tokens", 0)
        return {"session": job.index, "new_tokens": tokens, "end": end, "wall_s": wall, "calls": 1,
                "round_trip_s": statistics.median(gaps) if gaps else 0.0, "tau": 1.0, "accepted": 0.0, "asked": 0.0, "tree_nodes": 0.0,
                "diverged": 0, "exact": None}

    return _threads(spec, jobs, one)


# -- the server's side: engine totals from /metrics ----------------------------------------------------

@dataclass(frozen=True)
class EngineTotals:
    steps: float = 0.0
    device_s: float = 0.0  # the forward alone (edgespec_engine_step_seconds{part="device"})
    host_s: float = 0.0  # packing, launch, readback and per-item Python
    rows: float = 0.0  # items (sessions' steps, streams' tokens) summed over the scheduler's forwards
    forwards: float = 0.0  # the scheduler's batched forwards

    def minus(self, other: "EngineTotals") -> "EngineTotals":
        return EngineTotals(*(a - b for a, b in zip(asdict(self).values(), asdict(other).values())))


def engine_totals(http_address: str) -> EngineTotals:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    got = {"steps": 0.0, "device_s": 0.0, "host_s": 0.0, "rows": 0.0, "forwards": 0.0}
    totals = {"edgespec_engine_steps_total": "steps", "edgespec_scheduler_items_total": "rows",
              "edgespec_scheduler_forwards_total": "forwards"}
    text = httpx.get(f"http://{http_address}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                got[totals[sample.name]] = sample.value
            elif sample.name == "edgespec_engine_step_seconds_total":
                got["device_s" if sample.labels.get("part") == "device" else "host_s"] += sample.value
    # on a CPU "launch" holds the forward too: the host's share is what is left after the device's
    if got["host_s"] >= got["device_s"]:
        got["host_s"] -= got["device_s"]
    return EngineTotals(**got)


# -- figures --------------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def summary(system: str, n: int, sessions: list[dict], wall: float, engine: EngineTotals,
            args: argparse.Namespace) -> dict:
    tokens = sum(s["new_tokens"] for s in sessions)
    rates = [s["new_tokens"] / s["wall_s"] for s in sessions if s["wall_s"]]
    per_token = [s["wall_s"] / s["new_tokens"] for s in sessions if s["new_tokens"]]
    trips = [s["round_trip_s"] for s in sessions]
    return {"bench": "capacity", "system": system, "sessions": n, "profile": args.profile, "accept": args.accept,
            "nodes": args.nodes, "max_tokens": args.max_tokens, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall else 0.0, "per_session_mean": statistics.fmean(rates) if rates else 0,
            "per_session_min": min(rates, default=0.0), "time_per_token_p50_ms": 1000 * _pct(per_token, 0.5),
            "time_per_token_p99_ms": 1000 * _pct(per_token, 0.99), "round_trip_p50_ms": 1000 * _pct(trips, 0.5),
            "round_trip_p99_ms": 1000 * _pct(trips, 0.99), "tau": statistics.fmean(s["tau"] for s in sessions),
            "accepted_per_tree": statistics.fmean(s["accepted"] for s in sessions),
            "tree_nodes": statistics.fmean(s["tree_nodes"] for s in sessions),
            "asked_per_tree": statistics.fmean(s["asked"] for s in sessions),
            "diverged": sum(s["diverged"] for s in sessions),
            "drafts_by_accepted": _summed([s.get("drafts_by_accepted", []) for s in sessions]),
            "engine_steps": engine.steps, "mean_batch": engine.rows / engine.forwards if engine.forwards else None,
            "device_ms_per_token": 1000 * engine.device_s / tokens if tokens else 0.0,
            "host_ms_per_token": 1000 * engine.host_s / tokens if tokens else 0.0}


def _summed(lists: list[list[int]]) -> list[int]:
    out = [0] * max((len(x) for x in lists), default=0)
    for x in lists:
        for k, v in enumerate(x):
            out[k] += v
    return out


def _line(r: dict) -> str:
    return (f"N={r['sessions']} {r['system']}: {r['tokens_per_s']:.1f} tok/s, per session {r['per_session_min']:.2f}"
            f"-{r['per_session_mean']:.2f}, tau {r['tau']:.2f}")


def capacity(rows: list[dict], system: str, rate: float) -> int:
    """The most sessions at which the slowest one kept ``rate`` tokens/s (0: not even one)."""
    return max((r["sessions"] for r in rows if r["system"] == system and r["per_session_min"] >= rate), default=0)


def report(rows: list[dict], rate: float) -> str:
    from .records import markdown_table

    def fmt(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    table = markdown_table(
        ["N", "system", "tokens/s", "per session mean", "slowest", "ms/token p50", "p99", "round trip (plain: chunk gap) p50 ms",
         "p99", "tau", "accepted a tree (asked)", "nodes a tree", "steps", "mean batch", "forward ms/token", "host ms/token", "left the text"],
        [[r["sessions"], r["system"], fmt(r["tokens_per_s"], ".1f"), fmt(r["per_session_mean"]),
          fmt(r["per_session_min"]), fmt(r["time_per_token_p50_ms"], ".1f"), fmt(r["time_per_token_p99_ms"], ".1f"),
          fmt(r["round_trip_p50_ms"], ".1f"), fmt(r["round_trip_p99_ms"], ".1f"),
          fmt(r["tau"]), f"{r['accepted_per_tree']:.2f} ({r['asked_per_tree']:.2f})", fmt(r["tree_nodes"], ".1f"), int(r["engine_steps"]), fmt(r["mean_batch"], ".1f"),
          fmt(r["device_ms_per_token"], ".3f"), fmt(r["host_ms_per_token"], ".3f"), r["diverged"]] for r in rows])
    spec, plain = capacity(rows, "speculative", rate), capacity(rows, "plain-api", rate)
    ratio = f"{spec / plain:.2f}x" if plain else "n/a (the plain API kept the rate at no N measured)"
    return (f"{table}\n\ncapacity at >= {rate:g} tokens/s a session: speculative {spec}, plain API {plain} "
            f"(of the N measured): {ratio}\n")
