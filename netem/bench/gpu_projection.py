"""Computed, not measured: what each drafter of a `bench drafting` run would reach against a GPU server.

    edgespec bench gpu-projection RESULT.json --profiles 5g,4g --verify-ms 0:5.2,32:6.4

A CPU-only machine cannot time the client against an H200, but the loop's costs come apart: the drafter's
trees (tau, nodes and drafting time per tree, the share of trees drafted ahead that were sent at once) are
the client's, measured in the run (a tree's own drafting: not the trees drafted ahead for guesses that
missed while the client waited on a verdict); the verification is the server's, taken from a cost curve
measured on the GPU (milliseconds per tree size; the default is the 1.5B's on an H200 with CUDA graphs, the
README's); the link is a profile's mean round trip and its rate. A step then costs what the planner charges
it (``client/loop/tree_size.py``): serially drafting + round trip + verification; drafted ahead, the longer
of the drafting and the flight plus the misses' drafting again. The plain API streams: one round trip, then
a decode step a token. Each figure is printed as computed, beside the CPU run it comes from.

The run's drafting times are its own: on loopback the CPU server shared the client's cores, so they are an
upper bound; ``--draft-ms NAME=MS`` puts a quiet client's figure (``drafter_cost``) in their place.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from edgespec.client import verify_time
from edgespec.netem.profile import load_profile


@dataclass(frozen=True)
class DrafterFigures:
    """One drafter's trees in a run, per tree (a verification)."""

    name: str
    tau: float  # tokens committed per verification
    nodes: float  # draft nodes per tree
    draft_s: float  # drafting time per tree
    hit_rate: float  # share of the trees drafted ahead that went out at once (0: the serial loop)
    bytes_per_step: float  # both directions, per verification


@dataclass(frozen=True)
class Link:
    name: str
    round_trip_s: float
    rate_bytes_s: float | None  # the slower direction's rate; None: unlimited


def figures_of(runs: list[dict], name: str, draft_ms: float | None = None) -> DrafterFigures:
    """One method's figures summed over its runs (every prompt), from the client's own metrics. A tree's
    drafting is its own: the run's drafting less what it drafted ahead for guesses that missed
    (``draft_ahead_s - saved_s``). The pipelined loop drafts those while a verification is out, where a client
    of its own would idle; the step charge below counts a missed guess's tree again as drafting after the
    verdict. Charged in, they made a learned head's tree 6-7x its own cost (116 ms a tree against 18: its
    guesses hit 3 % of the time), the 0.5B's 1.8x (hits 44 %)."""
    ms = [r["metrics"] for r in runs if r["method"] == name and r.get("metrics")]
    if not ms:
        raise ValueError(f"the run has no client metrics for {name!r}")
    total = lambda key: sum(m[key] for m in ms)  # noqa: E731
    steps = total("num_verifications")
    if not steps:
        raise ValueError(f"{name!r} made no verification in the run")
    committed = total("num_accepted_tokens") + steps
    guesses = total("guesses")
    # GenerationMetrics.own_draft_s over JSON rows; runs from before drafting ahead was counted lack the fields
    missed = sum(m.get("draft_ahead_s", 0.0) - m.get("saved_s", 0.0) for m in ms)
    own = (total("draft_s") - missed) / max(1, total("num_drafts"))
    return DrafterFigures(name, committed / steps, total("num_draft_tokens") / steps,
                          draft_ms / 1000 if draft_ms is not None else own,
                          total("guess_hits") / guesses if guesses else 0.0,
                          (total("bytes_up") + total("bytes_down")) / total("calls"))


def link_of(profile: str) -> Link:
    p = load_profile(profile)
    rates = [d.rate_mbit for d in (p.up, p.down) if d.rate_mbit]
    return Link(p.name, (p.expected_one_way_ms("up") + p.expected_one_way_ms("down")) / 1000,
                min(rates) * 1e6 / 8 if rates else None)


def step_s(f: DrafterFigures, link: Link, curve: tuple[tuple[int, ...], tuple[float, ...]]) -> float:
    """One verification step's seconds: the better of serial drafting and drafting ahead (the planner's
    charge for a tree drafted ahead without stopping misses)."""
    transfer = f.bytes_per_step / link.rate_bytes_s if link.rate_bytes_s else 0.0
    flight = link.round_trip_s + transfer + verify_time(round(f.nodes), *curve)
    serial = f.draft_s + flight
    ahead = max(f.draft_s, flight) + (1.0 - f.hit_rate) * f.draft_s
    return min(serial, ahead)


def plain_tokens_per_s(tokens: int, link: Link, decode_s: float) -> float:
    """The server's plain API, streamed: a round trip to the first token, then one decode step each."""
    return tokens / (link.round_trip_s + tokens * decode_s)


def parse_curve(text: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    try:
        pairs = sorted((int(n), float(ms) / 1000) for n, ms in (p.split(":") for p in text.split(",") if p.strip()))
    except ValueError:
        raise SystemExit(f"--verify-ms takes NODES:MS pairs separated by commas (0 = a decode step), got {text!r}")
    if not pairs or pairs[0][0] != 0:
        raise SystemExit(f"--verify-ms needs the decode step's time (0:MS) first, got {text!r}")
    return tuple(n for n, _ in pairs), tuple(s for _, s in pairs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("result", help="a `bench drafting --out` file")
    p.add_argument("--profiles", default="5g,4g", help="network profiles whose mean round trip and rate to use")
    p.add_argument("--verify-ms", default="0:5.2,32:6.4",
                   help="the GPU server's verification time by tree size, NODES:MS,... (0: a decode step); the "
                        "default: the 1.5B on an H200 with CUDA graphs")
    p.add_argument("--draft-ms", action="append", default=[], metavar="NAME=MS",
                   help="a drafter's drafting time per tree on a quiet client, in place of the run's")
    p.add_argument("--tokens", type=int, default=128, help="answer length for the plain API's stream")


def run(args) -> int:
    data = json.loads(Path(args.result).read_text())
    curve = parse_curve(args.verify_ms)
    overrides = {}
    for item in args.draft_ms:
        name, _, ms = item.partition("=")
        try:
            overrides[name] = float(ms)
        except ValueError:
            raise SystemExit(f"--draft-ms takes NAME=MS, got {item!r}")
    names = [n for n in dict.fromkeys(r["method"] for r in data["runs"]) if any(
        r["method"] == n and r.get("metrics") for r in data["runs"])]
    drafters = [figures_of(data["runs"], n, overrides.get(n)) for n in names]
    links = [link_of(p.strip()) for p in args.profiles.split(",") if p.strip()]
    print(f"Computed (not measured): the drafters' trees from {Path(args.result).name}, the server's "
          f"verification {args.verify_ms} ms by tree size.\n")
    head = "| drafter | tau | nodes / tree | drafting ms / tree | hit rate | " + " | ".join(
        f"{l.name}: tokens/s (vs plain API)" for l in links) + " |"
    print(head)
    print("|" + "---|" * (5 + len(links)))
    plain = {l.name: plain_tokens_per_s(args.tokens, l, curve[1][0]) for l in links}
    for f in drafters:
        cells = [f"{f.tau / step_s(f, l, curve):.1f} ({f.tau / step_s(f, l, curve) / plain[l.name]:.2f}x)"
                 for l in links]
        print(f"| {f.name} | {f.tau:.2f} | {f.nodes:.1f} | {f.draft_s * 1000:.0f} | {f.hit_rate:.2f} | "
              + " | ".join(cells) + " |")
    print("| plain API, streamed | 1 | - | - | - | " + " | ".join(f"{plain[l.name]:.1f}" for l in links) + " |")
    return 0
