"""Training prompts derived from code and documentation on this machine.

No hub is reachable here, so the prompts come from the Python standard library
that ships with the interpreter: docstrings of public functions become "write a
function that ..." instructions, function bodies become "explain this code"
prompts, and chunks of module source are plain code text. Everything is chosen
by a seeded RNG over a sorted file list, so the same seed gives the same set.

HumanEval and MT-Bench are test sets: files from their packages are never read,
and a prompt that mentions them is dropped.
"""
from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path

from .corpus import is_test_set  # test sets never enter training data


@dataclass(frozen=True)
class Sample:
    id: str  # stable across runs: source file + object name + kind
    kind: str  # "write" (function from docstring), "explain" (code explanation) or "code" (plain text)
    prompt: str  # the user message; for kind "code" the code text itself


def source_files(root: Path | None = None) -> list[Path]:
    """Sorted .py files of the standard library (no tests, no test sets)."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    skip_dirs = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__",
                 "turtledemo", "tkinter", "ensurepip"}
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts[:-1])
        if parts & skip_dirs or is_test_set(str(path)):
            continue
        out.append(path)
    return out


def functions_of(path: Path) -> list[tuple[str, str, str]]:
    """(name, docstring, source) for documented public functions of a file."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        body = ast.get_source_segment(source, node, padded=True)
        if not doc or not body:
            continue
        found.append((node.name, doc, body))
    return found


def _write_prompt(name: str, doc: str) -> str | None:
    first = " ".join(doc.strip().split("\n\n")[0].split())  # the first paragraph, on one line
    if not 25 <= len(first) <= 400:
        return None
    return f"Write a Python function `{name}` that does the following: {first}"


def _explain_prompt(body: str) -> str | None:
    lines = textwrap.dedent(body).splitlines()
    if not 4 <= len(lines) <= 40:
        return None
    code = "\n".join(lines)
    return f"Explain what this Python code does:\n```python\n{code}\n```"


def derive_samples(seed: int, n_write: int, n_explain: int, n_code: int, code_chars: int = 1500,
                   per_file: int = 3, root: Path | None = None) -> list[Sample]:
    """A reproducible mix of prompts (write / explain) and plain code chunks."""
    rng = random.Random(seed)
    files = source_files(root)
    order = files[:]
    rng.shuffle(order)
    writes: dict[str, Sample] = {}
    explains: dict[str, Sample] = {}
    # Parse files in a seeded order until both kinds are full; a few per file keeps the topics varied.
    for path in order:
        if len(writes) >= n_write and len(explains) >= n_explain:
            break
        stem = f"{path.parent.name}/{path.stem}"
        funcs = functions_of(path)
        rng.shuffle(funcs)
        for name, doc, body in funcs[:per_file]:
            w = _write_prompt(name, doc)
            if w and not is_test_set(w) and len(writes) < n_write:
                writes.setdefault(f"write:{stem}:{name}", Sample(f"write:{stem}:{name}", "write", w))
            e = _explain_prompt(body)
            if e and not is_test_set(e) and len(explains) < n_explain:
                explains.setdefault(f"explain:{stem}:{name}", Sample(f"explain:{stem}:{name}", "explain", e))
    codes = []
    for path in rng.sample(files, min(len(files), n_code * 2)):
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) < code_chars // 2 or is_test_set(text):
            continue
        start = rng.randrange(0, max(1, len(text) - code_chars))
        codes.append(Sample(f"code:{path.parent.name}/{path.stem}:{start}", "code", text[start:start + code_chars]))
        if len(codes) >= n_code:
            break
    return list(writes.values()) + list(explains.values()) + codes


def split_of(sample_id: str, val_fraction: float) -> str:
    """'val' or 'train', decided by a hash of the id so it never changes when the set grows."""
    import hashlib

    h = int.from_bytes(hashlib.sha256(sample_id.encode()).digest()[:4], "little")
    return "val" if h / 2**32 < val_fraction else "train"
