"""The index of a results tree: one folder per experiment, one row per folder in the tree's README.md.

A results tree (``netem/results/``) holds one folder per experiment. A benchmark folder holds its records
(``EXPERIMENT.jsonl``, or ``EXPERIMENT.jsonl.gz`` once archived), each line carrying the commit, the machine,
the time and the command, and the ``report.md`` that ``edgespec bench report FOLDER`` writes from them. A folder
whose figures come from elsewhere (a micro-benchmark's table, a GPU machine's logs) says the same in an
``experiment.json``: ``command`` (a list), ``commit``, ``machine``, ``date``, ``report`` (its main file) and
``what``.

``edgespec bench report TREE`` writes TREE/README.md from the folders, and every report written into a folder
of a tree updates it, so the index never lists what the folders do not hold.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .records import read_records, record_files

EXPERIMENTS = ("speed", "link", "disconnect", "codec", "specbench")  # the record files a folder can hold
FIRST_LINE = "<!-- written by `edgespec bench report` from the experiments' folders: regenerate it, do not edit -->"
INDEX = "README.md"


def is_results_tree(folder: Path) -> bool:
    """A folder whose README.md is an index this module wrote."""
    index = folder / INDEX
    return index.is_file() and index.read_text(encoding="utf-8").startswith(FIRST_LINE)


def has_experiment(folder: Path) -> bool:
    return (folder / "experiment.json").is_file() or any(record_files(folder, e) for e in EXPERIMENTS)


def describe(folder: Path) -> dict:
    """What the index says of one experiment's folder: what, commands, commits, machines, dates, report."""
    meta = folder / "experiment.json"
    if meta.is_file():
        d = json.loads(meta.read_text(encoding="utf-8"))
        return {"what": d["what"], "commands": list(d["command"]), "commits": [d["commit"]],
                "machines": [d["machine"]], "dates": [d["date"]], "report": d["report"]}
    kinds, commands, commits, machines, dates = [], [], [], [], []
    for experiment in EXPERIMENTS:
        rows = read_records(folder, experiment)
        if not rows:
            continue
        kinds.append(experiment)
        for r in rows:
            env = r["env"]
            m = env["machine"]
            commands.append(portable_command(env["settings"]))
            commits.append(env["commit"])
            machines.append(f"{m['cpu']} ({m['cores']} cores{', ' + m['gpu'] if m.get('gpu') else ''})")
            dates.append(env["time"][:10])
    return {"what": "`edgespec bench " + "`, `".join(kinds) + "`", "commands": _unique(commands),
            "commits": _unique(commits), "machines": _unique(machines), "dates": sorted(set(dates)),
            "report": "report.md"}


def portable_command(settings: dict) -> str:
    """A run's command as a reader can use it: its output folder (where it ran, not where its records now
    lie) shown as OUT, and other paths of the machine it ran on (a question file, say) by their file name."""
    out = settings.get("out") or ""
    command = settings.get("command") or ""
    command = command.replace(out, "OUT") if out else command
    return re.sub(r"(?<=[\s=])/\S*/([^/\s]+)", r"\1", command)


def _unique(items: list[str]) -> list[str]:
    return [x for x in dict.fromkeys(items) if x]


def _cell(items: list[str], code: bool = False) -> str:
    shown = [f"`{x}`" if code else x for x in items]
    return "<br>".join(s.replace("|", "\\|") for s in shown) or "–"


def write_index(tree: Path) -> Path:
    """Write TREE/README.md: a row per experiment folder (sorted by name), linking its report."""
    folders = sorted(p for p in tree.iterdir() if p.is_dir() and has_experiment(p))
    if not folders:
        raise FileNotFoundError(f"no experiment folders (records or experiment.json) in {tree}")
    rows = []
    for folder in folders:
        d = describe(folder)
        report = folder / d["report"]
        name = f"[{folder.name}]({folder.name}/{d['report']})" if report.exists() else folder.name
        rows.append(f"| {name} | {d['what']} | {_cell(d['commands'], code=True)} | {_cell(d['commits'], code=True)} "
                    f"| {_cell(d['machines'])} | {_cell(d['dates'])} |")
    text = "\n".join([
        FIRST_LINE, "", "# Results", "",
        "One folder per experiment: its records (one JSON line per generation, gzipped once archived, each with "
        "the commit, the machine, the cores, the time and the command) and the `report.md` that "
        "`edgespec bench report FOLDER` writes from them. The readings are in [netem/README.md](../README.md#results). "
        "`OUT` in a command is the folder the run wrote to; a file it read from elsewhere on that machine "
        "shows its name alone.", "",
        "| experiment | what | command | commit | machine | date |", "|---|---|---|---|---|---|", *rows, ""])
    path = tree / INDEX
    path.write_text(text, encoding="utf-8")
    return path
