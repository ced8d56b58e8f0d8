"""A run's records: the environment it ran in, one JSON object a line per measurement, Markdown tables."""
from __future__ import annotations

import gzip
import json
import os
import platform
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Iterator


def environment(settings: dict, cpus: dict | None = None) -> dict:
    """Where and how a run happened: commit, machine, library versions, settings, and the cores the server
    and the client ran on (``CpuSplit.to_dict()``; None: the run had no server and client)."""
    import torch
    import transformers

    from edgespec.shared.device import cpu_name

    root = Path(__file__).resolve().parents[2]  # the checkout: netem/bench/ is two levels down
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                                text=True).stdout.strip())
    return {"commit": commit + ("+dirty" if dirty else ""), "machine": {
        "cpu": cpu_name(), "cores": os.cpu_count(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "settings": settings,
        **({"cpus": cpus} if cpus is not None else {})}


class JsonLines:
    """Append one JSON object a line; every record carries the run's environment."""

    def __init__(self, path: Path, env: dict):
        self.path = path
        self.env = env
        self.done: set[tuple] = set()  # keys of generations an earlier, stopped run already wrote
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({**record, "env": self.env}) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file, gzipped (``.gz``, as the results tree keeps them) or not."""
    opener = gzip.open if Path(path).suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def record_files(out: Path, experiment: str) -> list[Path]:
    """An experiment's record files in `out`: the archived, gzipped part first (the results tree keeps
    records gzipped), then the plain file a run appends to."""
    return [p for p in (out / f"{experiment}.jsonl.gz", out / f"{experiment}.jsonl") if p.exists()]


def read_records(out: Path, experiment: str) -> list[dict]:
    """Every record of `experiment` in `out` ([] where there is none)."""
    return [r for p in record_files(out, experiment) for r in read_jsonl(p)]


def group_by(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    """Rows by the values of `keys`, in the order the groups first appear."""
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[tuple(r.get(k) for k in keys)].append(r)
    return dict(out)


def markdown_table(header: list[str], rows: Iterable[list], rule: str | list[str] = "---") -> str:
    """A Markdown table: the header's cells, a rule under each (one for all, or one a column), a line a row
    (a None cell: "| |")."""
    line = lambda cells: "|" + "".join(" |" if c is None else f" {c} |" for c in cells)  # noqa: E731
    rules = [rule] * len(header) if isinstance(rule, str) else rule
    return "\n".join([line(header), "|" + "".join(f"{r}|" for r in rules), *map(line, rows)])


def cell(x, spec: str = ".2f", suffix: str = "") -> str:
    """A table cell: x formatted, or "–" where there is no figure."""
    return "–" if x is None else format(x, spec) + suffix


def sse_chunks(url: str, body: dict, timeout: float) -> Iterator[dict]:
    """The JSON chunks of an OpenAI-style streamed response (server-sent events), as they arrive."""
    import httpx

    with httpx.stream("POST", url, json=body, timeout=timeout) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])
