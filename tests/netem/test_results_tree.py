"""The results tree: one folder per experiment under netem/results/, each with its command, commit, machine,
date and report; an index `edgespec bench report` writes; at most 3 MB tracked; every results path a tracked
doc names exists."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.netem.bench.results_index import FIRST_LINE, describe, has_experiment

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / "netem" / "results"
LIMIT_BYTES = 3_000_000

pytestmark = pytest.mark.skipif(not (shutil.which("git") and (REPO / ".git").exists()), reason="needs the checkout")


def tracked(*patterns: str) -> list[str]:
    """Tracked files and those git would add (untracked, not ignored): what a commit can hold."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns], cwd=REPO, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split() if (REPO / p).exists()]


def edgespec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_tracked_result_data_is_at_most_3_mb():
    files = tracked("netem/results")
    assert files, "netem/results/ holds no tracked files"
    assert sum((REPO / f).stat().st_size for f in files) <= LIMIT_BYTES


def test_one_results_tree_and_no_scripts_in_it():
    others = [f for f in tracked("netem") if re.match(r"netem/results[^/]", f)]
    assert not others, others[:5]
    scripts = [f for f in tracked("netem/results") if f.endswith((".py", ".sh"))]
    assert not scripts  # a script that stays lives in the package, where a test runs it


@pytest.mark.parametrize("folder", sorted(p.name for p in TREE.iterdir() if p.is_dir()))
def test_every_experiment_has_its_command_commit_machine_date_and_report(folder):
    path = TREE / folder
    assert has_experiment(path), f"{folder}: neither records nor experiment.json"
    d = describe(path)
    for key in ("commands", "commits", "machines", "dates"):
        assert d[key] and all(d[key]), f"{folder}: no {key}"
    assert (path / d["report"]).is_file(), f"{folder}: no {d['report']}"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d", x) for x in d["dates"])
    assert not any("/work/" in c or "/tmp/" in c for c in d["commands"])  # the run's folder reads OUT


def results_paths(doc: Path) -> list[tuple[str, Path]]:
    """(as written, the path it names) for every link into netem/results/ and every netem/results/... path
    a doc writes out (in prose or in a command)."""
    text = doc.read_text(encoding="utf-8")
    found = []
    for target in re.findall(r"\]\(([^)\s#]+)", text):
        if not re.match(r"[a-z]+:", target):
            path = (doc.parent / target).resolve()
            if TREE in path.parents or path == TREE:
                found.append((target, path))
    for written in re.findall(r"netem/results/[\w./@~+*-]*", text):
        name = written.split("*")[0].rstrip(".")
        found.append((written, REPO / name))
    return found


def test_every_results_path_a_tracked_doc_names_exists():
    broken = [f"{doc}: {written}" for doc in tracked("*.md") for written, path in results_paths(REPO / doc)
              if not path.exists()]
    assert not broken, broken


def test_no_hand_written_doc_names_an_old_results_folder():
    old = re.compile(r"results-(overlap|specbench|shapes|pipeline|queued|decode-ahead|gpu|multiturn|constrained)\b")
    named = [f"{doc}: {m.group(0)}" for doc in tracked("*.md", "*.py", "*.sh") if not doc.startswith("netem/results/")
             for m in old.finditer((REPO / doc).read_text(encoding="utf-8", errors="replace"))]
    assert not named, named


def test_the_index_is_what_bench_report_writes(tmp_path):
    copy = tmp_path / "results"
    # Not the answer files and logs a report or a run writes beside the records (git ignores them)
    shutil.copytree(TREE, copy, ignore=lambda folder, names: [n for n in names if n.endswith("-server.log")
                                                               or (n == "specbench" and Path(folder) != TREE)])
    (copy / "README.md").unlink()
    run = edgespec("bench", "report", str(copy))
    assert run.returncode == 0, run.stderr
    assert (copy / "README.md").read_text(encoding="utf-8") == (TREE / "README.md").read_text(encoding="utf-8")
    for folder in (p.name for p in TREE.iterdir() if p.is_dir()):
        assert f"| [{folder}]({folder}/" in (copy / "README.md").read_text(encoding="utf-8")


def test_a_report_written_into_the_tree_updates_its_index(tmp_path):
    """`edgespec bench report FOLDER` for a folder of a tree writes its report from the gzipped records and puts
    the folder into the tree's index."""
    tree = tmp_path / "results"
    (tree / "old").mkdir(parents=True)
    shutil.copy(TREE / "decode-ahead" / "link.jsonl.gz", tree / "old")
    assert edgespec("bench", "report", str(tree / "old"), "--no-plots").returncode == 0
    assert not (tree / "README.md").exists()  # a folder alone is not a tree: no index appears
    assert edgespec("bench", "report", str(tree)).returncode == 0
    index = (tree / "README.md").read_text(encoding="utf-8")
    assert index.startswith(FIRST_LINE) and "[old](old/report.md)" in index and "[new]" not in index
    (tree / "new").mkdir()
    shutil.copy(TREE / "queued" / "link.jsonl.gz", tree / "new")
    run = edgespec("bench", "report", str(tree / "new"), "--no-plots")
    assert run.returncode == 0, run.stderr
    report = (tree / "new" / "report.md").read_text(encoding="utf-8")
    assert "Commit `f78c473`" in report and "## Plots" not in report and not list((tree / "new").glob("*.png"))
    index = (tree / "README.md").read_text(encoding="utf-8")
    assert "[new](new/report.md)" in index and "`f78c473`" in index
