"""Turn experiment JSON lines into a Markdown report (its plots: plots.py), and put it into the README.

Aggregates are over generations: tokens/s is total new tokens over total wall
time (a long answer weighs more than a short one, as for a user reading them);
acceptance length is total committed tokens over total verifications.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .activation_codec import Row as CodecRow, markdown as codec_table
from .plots import draw_plots
from .records import cell, group_by, markdown_table, read_records
from .results_index import is_results_tree, portable_command, write_index
from .specbench import prompts_note, specbench_section, write_answer_files


def _agg(rows: list[dict]) -> dict:
    tokens, wall, accepted, calls, up, down = (
        sum(r.get(k, 0) for r in rows)
        for k in ("new_tokens", "wall_s", "num_accepted_tokens", "calls", "bytes_up", "bytes_down"))
    # tau is per verification, empty trees included: num_verifications (num_drafts in records made before drafts
    # became vLLM's, trees with nodes)
    drafts = sum(r.get("num_verifications", r.get("num_drafts", 0)) for r in rows)
    guesses, hits = (sum(r.get(k, 0) for r in rows) for k in ("guesses", "guess_hits"))  # the pipelined loop's
    plain = sum(r.get("plain_steps", 0) for r in rows)  # Drafts without a tree (the planner found trees lose)
    rtts = sorted(x for r in rows for x in r.get("round_trips_s", []) or [])
    return {"n": len(rows), "tokens": tokens, "tok_s": tokens / wall if wall else 0.0,
            "tau": (accepted + drafts) / drafts if drafts else None,
            "calls_100": 100 * calls / tokens if tokens else 0.0,
            "up_tok": up / tokens if tokens else 0.0, "down_tok": down / tokens if tokens else 0.0,
            "hit_rate": hits / guesses if guesses else None,
            "plain_share": plain / calls if calls and any("plain_steps" in r for r in rows) else None,
            "rtt": {p: rtts[min(len(rtts) - 1, int(p / 100 * len(rtts)))] for p in (50, 90, 99)} if rtts else None}


def speed_section(rows: list[dict]) -> str:
    groups = group_by(rows, "system")
    base = _agg(groups.get(("plain-api",), []))["tok_s"]
    lines = []
    for (system,), rs in sorted(groups.items()):
        a = _agg(rs)
        lines.append([system, a["n"], a["tokens"], f"{a['tok_s']:.2f}", cell(a["tau"]), f"{a['tok_s'] / base:.2f}x"]
                     if base else ["–"])
    return markdown_table(["system", "generations", "new tokens", "tokens/s", "acceptance length",
                           "speedup vs plain decoding"], lines)


def link_section(rows: list[dict]) -> str:
    lines = []
    for (profile,), prow in sorted(group_by(rows, "profile").items()):
        groups = group_by(prow, "system")
        base = _agg(groups.get(("plain-api",), []))["tok_s"]
        for (system,), rs in sorted(groups.items()):
            a = _agg(rs)
            lines.append([profile, system, f"{a['tok_s']:.2f}", f"{a['tok_s'] / base:.2f}x" if base else "–",
                          cell(a["tau"]), f"{a['calls_100']:.1f}", f"{a['up_tok']:.0f}", f"{a['down_tok']:.0f}",
                          " / ".join(f"{1000 * a['rtt'][p]:.0f}" for p in (50, 90, 99)) if a["rtt"] else "–",
                          cell(a["hit_rate"]), cell(a["plain_share"])])
    return markdown_table(["profile", "system", "tokens/s", "vs plain API", "acceptance length", "calls / 100 tokens",
                           "bytes up / token", "bytes down / token", "RTT p50 / p90 / p99 ms", "guess hit rate",
                           "plain steps / calls"],
                          lines) + "\n\n" + _by_set(rows)


def _by_set(rows: list[dict]) -> str:
    """Tokens/s and acceptance length per prompt set: copying-friendly code prompts and open-ended
    chat favour different drafters, which one average hides."""
    sets = sorted({r["set"] for r in rows})
    lines = []
    for (profile, system), rs in sorted(group_by(rows, "profile", "system").items()):
        aggs = [_agg(group_by(rs, "set").get((name,), [])) for name in sets]
        lines.append([profile, system] + [f"{a['tok_s']:.2f} ({cell(a['tau'])})" if a["n"] else "–" for a in aggs])
    return markdown_table(["profile", "system"] + [f"{s}: tokens/s (acceptance length)" for s in sets], lines)


def disconnect_section(rows: list[dict]) -> str:
    lines = []
    own = {r["prompt_id"]: r["text"] for r in rows if r["system"] == "target"}
    key = lambda kv: (kv[0][0] == "target", kv[0][0], float("inf") if kv[0][1] is None else kv[0][1])  # noqa: E731
    for (drafter, cut), rs in sorted(group_by(rows, "system", "cut_after").items(), key=key):
        n = len(rs)
        ok = sum(r["passed"] for r in rs)
        low = sum(r["passed_stop_at_cut"] for r in rs)
        if drafter == "target":  # the reference: the target's own greedy answers, no drafter, no cut
            lines.append(["target alone (its own greedy answer)", "no cut", n, f"{ok / n:.3f}", "–", "–"])
            continue
        compared = [r for r in rs if r["prompt_id"] in own]
        same = f"{sum(r['text'] == own[r['prompt_id']] for r in compared)}/{len(compared)}" if compared else "–"
        lines.append([drafter, "never" if cut is None else cut, n, f"{ok / n:.3f}", f"{low / n:.3f}", same])
    return markdown_table(["drafter", "cut after B tokens", "problems", "pass@1 (offline completion)",
                           "pass@1 (stop at the cut)", "answer = the target's own"], lines)


def codec_section(rows: list[dict]) -> str:
    fields = CodecRow.__dataclass_fields__
    return codec_table([CodecRow(**{k: r[k] for k in fields}) for r in rows])


SECTIONS = {"speed": ("Speed on an ideal link", speed_section), "link": ("Under emulated networks", link_section),
            "disconnect": ("Disconnection success", disconnect_section), "codec": ("Activation codec", codec_section),
            "specbench": ("Spec-Bench", specbench_section)}


def _commits(rows: list[dict]) -> str:
    """The commit(s) a result file was made with: a resumed run can span several."""
    commits = list(dict.fromkeys(r["env"]["commit"] for r in rows))  # in the order the runs made them
    return ("Commit " if len(commits) == 1 else "Commits ") + ", ".join(f"`{c}`" for c in commits)


def _times(rows: list[dict]) -> str:
    starts = sorted({r["env"]["time"] for r in rows})
    return starts[0] if len(starts) == 1 else f"runs started {', '.join(starts)}"


def _stop_note(experiment: str, settings: dict) -> str:
    stop = settings.get("humaneval_stop") if experiment == "disconnect" else None
    if not stop:
        return ""
    shown = ", ".join("`" + x.replace("\n", "\\n") + "`" for x in stop)
    return f"; every answer (the target's own too) ends at its first {shown} (the end of its first code block)"


def _cpus_note(rows: list[dict]) -> str:
    """Where the server and the client ran (runs from before pinning recorded nothing); a server started elsewhere
    is named with the link tc showed to it."""
    servers = [json.loads(s) for s in dict.fromkeys(json.dumps(r["env"].get("server"), sort_keys=True) for r in rows)]
    if any(servers):
        return "; " + " / ".join(f"server at {s['grpc']} started elsewhere ({s['model'] or 'model unnamed'}), link "
                                 f"`{s['link']['profile']}` as tc shows it{' on ' + s['link']['device'] if s['link']['device'] else ''}"
                                 for s in servers if s)
    splits = [json.loads(s) for s in dict.fromkeys(json.dumps(r["env"].get("cpus"), sort_keys=True) for r in rows)]
    notes = [f"server on CPU {cpus['server']}, client on CPU {cpus['client']}" if cpus.get("pinned")
             else "server and client sharing every core" for cpus in splits if cpus is not None]
    return "; " + " / ".join(notes) if notes else ""


def _prompts_note(name: str, settings: dict, rows: list[dict]) -> str:
    if name == "specbench":
        return prompts_note(settings, rows)
    limits = settings.get("set_limits") or {}
    sets = ('humaneval',) if name == 'disconnect' else settings['prompt_sets']
    return "prompts: " + ", ".join(f"{limits.get(x, settings['limit'])} {x}" for x in sets)


def write_report(out: Path, plots: bool = True) -> Path:
    """Read every <experiment>.jsonl (or .jsonl.gz) in `out`, write out/report.md and, unless `plots` is False,
    the plots; in a results tree (results_index.py), its index too."""
    data = {name: rows for name in SECTIONS if (rows := read_records(out, name))}
    if not data:
        raise FileNotFoundError(f"no experiment results (*.jsonl) in {out}")
    parts = ["# edgespec bench report", ""]
    for name, rows in data.items():
        title, section = SECTIONS[name]
        env = rows[0]["env"]
        s = env["settings"]
        commands = sorted({portable_command(r["env"]["settings"]) for r in rows} - {""})
        parts += [f"## {title}", ""] + [f"`{c}`" for c in commands] + ([""] if commands else []) + [
                  f"{_commits(rows)}, {env['machine']['cpu']} ({env['machine']['cores']} cores"
                  f"{', GPU ' + env['machine']['gpu'] if env['machine']['gpu'] else ', no GPU'}){_cpus_note(rows)}, "
                  f"{_times(rows)}; target `{s['model']}`, small model `{s['drafter_model']}`, "
                  f"{_prompts_note(name, s, rows)}, "
                  f"max {s['max_new_tokens']} new tokens" + _stop_note(name, s) + ".", "", section(rows), ""]
    if "specbench" in data:  # its answer files, from the same records (`report` makes them again)
        write_answer_files(out, data["specbench"])
    # Without drawing, the plots already in the folder (a results tree keeps the ones a doc embeds) stay listed.
    drawn = draw_plots(out, data) if plots else sorted(p.name for p in out.glob("*.png"))
    if drawn:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in drawn] + [""]
    path = out / "report.md"
    path.write_text("\n".join(parts))
    if is_results_tree(out.resolve().parent):
        write_index(out.resolve().parent)
    return path


def markers(name: str = "edgespec-bench") -> tuple[str, str]:
    """The README's begin and end lines of a section named `name` (the Spec-Bench table has its own)."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


BEGIN, END = markers()


def splice_readme(report: Path, readme: Path, marker: str = "edgespec-bench") -> Path:
    """Put a report's sections into ``readme`` between the begin and end lines of `marker` (headings one
    level down, plots linked relative to the README), so the README's figures come from a run."""
    begin, end = markers(marker)
    lines = readme.read_text(encoding="utf-8").splitlines(keepends=True)
    # The markers are whole lines: the same words quoted inside a sentence (the CLI table) are not markers.
    marks = {m: [i for i, line in enumerate(lines) if line.strip() == m] for m in (begin, end)}
    if len(marks[begin]) != 1 or len(marks[end]) != 1 or marks[begin][0] > marks[end][0]:
        raise ValueError(f"{readme} needs exactly one line '{begin}' and, after it, one line '{end}' "
                         f"to put the report between")
    body = []
    for line in report.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            continue  # the report's title: the README's own heading stands above the markers
        if line.startswith("#"):
            line = "##" + line
        if line.startswith("![") and "](" in line:
            name = line[line.index("](") + 2:-1]
            target = Path(os.path.relpath(report.parent / name, readme.parent))
            line = f"![{name}]({target.as_posix()})"
        body.append(line)
    head, tail = lines[: marks[begin][0] + 1], lines[marks[end][0]:]
    readme.write_text("".join(head) + "\n".join(body).strip() + "\n" + "".join(tail), encoding="utf-8")
    return readme
