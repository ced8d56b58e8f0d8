"""The documentation: a short README, reference docs beside the code, links that resolve, and no
development history (issue numbers, session diaries, development-machine paths) in any tracked doc."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REFERENCE = ["server/README.md", "client/README.md", "netem/README.md", "proto/README.md", "shared/README.md",
             "deploy/README.md", "server/training/README.md"]

HISTORY = [
    (re.compile(r"(?<![\w./])/((work|root)/|home/\w|tmp/\w)"), "a development machine's path"),
    (re.compile(r"\bissues? #?\d+", re.I), "an issue number"),
    (re.compile(r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(st|nd|rd|th)|this|that|"
                r"earlier|previous|next|last|one engineer's|each) session's? (machine|run|CPU|box|log)", re.I),
     "a session diary"),
    (re.compile(r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) session\b", re.I),
     "a session diary"),
    (re.compile(r"\bsession (log|diary)\b", re.I), "a session log"),
    (re.compile(r"\bthe issue's\b|\bthe issue started\b", re.I), "an issue's history"),
]


def tracked_docs() -> list[str]:
    if shutil.which("git") and (REPO / ".git").exists():
        out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
        return [p for p in out.stdout.split() if (REPO / p).exists()]
    return [str(p.relative_to(REPO)) for p in REPO.rglob("*.md") if ".git" not in p.parts]


def history_in(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in HISTORY:
            if pattern.search(line):
                found.append(f"line {number}: {what}: {line.strip()[:120]}")
    return found


def test_the_history_patterns_catch_what_they_are_for():
    assert history_in("measured in the sixth session on a 2-core box")
    assert history_in("see issue 25 for the loop")
    assert history_in("run into /work/benchruns/s32/pipeline")
    assert history_in("(on this session's machine, an Intel Xeon)")
    assert not history_in("`client/root/` maps to the package; `runs/work/` is git-ignored")
    # The product's own sessions (a gRPC stream per generation) are not history.
    assert not history_in("A session is one bidirectional gRPC stream; one session's KV, per session, 64 sessions")


def test_the_readme_is_short_and_keeps_the_blocks_ci_reads():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    for heading in ("## Quickstart", "## Tests"):  # .ci/run reads the first bash block after each
        section = text.split(f"\n{heading}\n", 1)[1]
        block = re.search(r"```bash\n(.*?)```", section, re.S)
        assert block, heading
    quickstart = re.search(r"```bash\n(.*?)```", text.split("\n## Quickstart\n", 1)[1], re.S).group(1)
    assert "edgespec models prepare" in quickstart and "edgespec demo" in quickstart


@pytest.mark.parametrize("doc", REFERENCE)
def test_every_reference_doc_exists_and_the_readme_links_it(doc):
    assert (REPO / doc).is_file()
    assert f"]({doc})" in (REPO / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("doc", sorted(tracked_docs()))
def test_no_development_history_in_a_tracked_doc(doc):
    # the generated reports too: they show the folder a run wrote to as OUT (results_index.portable_command)
    found = history_in((REPO / doc).read_text(encoding="utf-8"))
    assert not found, f"{doc}:\n" + "\n".join(found)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def outside_code_blocks(text: str) -> str:
    """The text without its fenced blocks (a fence is a line that starts with three backquotes)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def anchors(path: Path) -> set[str]:
    text = outside_code_blocks(path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_slugs_are_githubs():
    assert slug("Spec-Bench (`edgespec bench specbench`)") == "spec-bench-edgespec-bench-specbench"
    assert slug("Drafting: every drafter against plain decoding and transformers' own speculative decoding") == \
        "drafting-every-drafter-against-plain-decoding-and-transformers-own-speculative-decoding"


@pytest.mark.parametrize("doc", ["README.md"] + REFERENCE)
def test_every_relative_link_resolves(doc):
    path = REPO / doc
    text = outside_code_blocks(path.read_text(encoding="utf-8"))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{doc}: {broken}"


def test_docstrings_cite_the_docs_in_the_repository():
    """No module cites "DESIGN section N", a document the repository does not have."""
    citing = []
    for folder in ("client", "server", "shared", "netem", "proto"):
        for path in (REPO / folder).rglob("*.py"):
            rel = str(path.relative_to(REPO))
            if "DESIGN" in path.read_text(encoding="utf-8"):
                citing.append(rel)
    assert not citing
