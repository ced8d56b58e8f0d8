"""Training prompts in the forms the client is asked in, built from what is on this machine.

A drafter learns the target's answers to the requests it will draft for, so the prompts copy
their forms, never their content:

- ``complete``: "complete this function" with a signature and docstring, in the words the
  benchmarks ask HumanEval in (``COMPLETE_INSTRUCTION``); the functions are public, documented
  functions of the standard library and the installed packages;
- ``chat``: single-turn requests of the kinds MT-Bench and Spec-Bench ask (writing, roleplay,
  reasoning, math, extraction, STEM and humanities questions, summarization, translation),
  filled from Debian's package descriptions, module docstrings and documentation paragraphs,
  and arithmetic drawn from a seeded RNG.

The target answers them (``data.build_dataset``). Every source and every prompt passes the test-set
filter (``corpus.is_test_set``): HumanEval, MT-Bench, Spec-Bench and IFBench never enter.
"""
from __future__ import annotations

import ast
import hashlib
import random
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .corpus import is_test_set

# The words `edgespec bench` wraps a HumanEval problem in (netem/bench/prompt_sets.py; a test keeps them equal).
COMPLETE_INSTRUCTION = "Complete the following Python code. Answer with the code only.\n```python\n{prompt}```"
DPKG_STATUS = Path("/var/lib/dpkg/status")


@dataclass(frozen=True)
class Topic:
    """Something on this machine a request can be about: a name and a paragraph that describes it."""

    id: str  # stable: where it came from
    name: str
    text: str


def completion_snippet(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The function's header and docstring, as a HumanEval problem gives them (the body left to write)."""
    doc = node.body[0] if node.body else None
    if not (isinstance(doc, ast.Expr) and isinstance(getattr(doc, "value", None), ast.Constant)
            and isinstance(doc.value.value, str)) or len(node.body) < 2:
        return None
    lines = source.splitlines()
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    head = lines[start:doc.end_lineno]
    if not head or len(head) > 40:
        return None
    indent = len(head[0]) - len(head[0].lstrip())
    return "\n".join(line[indent:] for line in head) + "\n"


# What reading and parsing an arbitrary installed file can raise. Besides bad syntax and encodings, CPython's
# parser gives up on very deep nesting with MemoryError or RecursionError, and CPython 3.11 before 3.11.8 can raise
# SystemError ("AST constructor recursion depth mismatch") on a file it parses fine elsewhere: a file is skipped.
PARSE_ERRORS = (SyntaxError, UnicodeDecodeError, ValueError, OSError, MemoryError, RecursionError, SystemError)


def parse_file(path: Path) -> tuple[str, ast.Module | None]:
    """A Python file's text and syntax tree; the tree is None when the file cannot be read or parsed."""
    try:
        source = path.read_text(encoding="utf-8")
        return source, ast.parse(source)
    except PARSE_ERRORS:
        return "", None


def completion_prompts(files: list[Path], n: int, rng: random.Random, per_file: int = 2) -> list[tuple[str, str]]:
    """(id, prompt) of up to n "complete this function" requests, a few per file, files in rng's order."""
    order = files[:]
    rng.shuffle(order)
    out: list[tuple[str, str]] = []
    for path in order:
        if len(out) >= n:
            break
        source, tree = parse_file(path)
        if tree is None:
            continue
        # Module-level functions only: a HumanEval problem is a free function, not a method.
        funcs = [f for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and not f.name.startswith("_")]
        rng.shuffle(funcs)
        taken = 0
        for f in funcs:
            snippet = completion_snippet(source, f)
            if snippet is None or not 60 <= len(snippet) <= 1500 or is_test_set(snippet):
                continue
            out.append((f"complete:{path.parent.name}/{path.stem}:{f.name}:{f.lineno}",
                        COMPLETE_INSTRUCTION.format(prompt=snippet)))
            taken += 1
            if taken >= per_file or len(out) >= n:
                break
    return out


def dpkg_topics(path: Path = DPKG_STATUS) -> list[Topic]:
    """Debian packages with their descriptions (short line and long text)."""
    if not path.is_file():
        return []
    topics = []
    for block in path.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        name = re.search(r"^Package: (.+)$", block, re.M)
        desc = re.search(r"^Description: (.+(?:\n .*)*)", block, re.M)
        if not (name and desc):
            continue
        lines = desc.group(1).split("\n")
        body = " ".join(line.strip() for line in lines[1:] if line.strip() != ".")
        text = f"{lines[0].strip()}. {body}".strip()
        if len(text) >= 40 and not is_test_set(text):
            topics.append(Topic(f"dpkg:{name.group(1)}", name.group(1), text))
    return topics


def docstring_topics(files: list[Path]) -> list[Topic]:
    """Modules with a docstring whose first paragraph says something (stdlib and installed packages)."""
    topics = []
    for path in files:
        tree = parse_file(path)[1]
        doc = ast.get_docstring(tree) if tree is not None else None
        if not doc:
            continue
        para = " ".join(doc.strip().split("\n\n")[0].split())
        if 60 <= len(para) <= 1200 and not is_test_set(para):
            name = path.stem if path.stem != "__init__" else path.parent.name
            topics.append(Topic(f"module:{path.parent.name}/{path.stem}", name, para))
    return topics


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 30 <= len(s.strip()) <= 240]


LANGUAGES = ("French", "German", "Spanish", "Chinese", "Japanese", "Italian", "Portuguese", "Russian")
FORMS = ("a short poem", "a haiku", "a persuasive email to a manager", "a blog post of about 200 words",
         "a short story", "a product announcement", "a limerick", "a formal letter", "a tweet thread of three tweets",
         "an FAQ with three questions and answers")
ROLES = ("a patient teacher", "a pirate captain", "a senior software engineer reviewing code", "a travel guide",
         "a sports commentator", "a museum curator", "a detective", "a nutritionist", "a startup founder pitching")
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena")
ITEMS = ("apples", "notebooks", "tickets", "pencils", "boxes of tea", "stamps", "cables", "plants")


def math_prompt(rng: random.Random) -> str:
    """A word problem with fresh numbers (GSM8K-like reasoning), from a few templates."""
    a, b, c = rng.randint(3, 40), rng.randint(2, 15), rng.randint(2, 9)
    who, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    forms = [
        f"{who} buys {a} {item} at ${b} each and pays with ${a * b + rng.randint(1, 50)}. How much change does "
        f"{who} get? Explain your reasoning step by step.",
        f"{who} has {a} {item}. {other} has {c} times as many. Together they give away {b}. How many are left?",
        f"A train travels {a * 10} km in {c} hours, then {b * 10} km in {rng.randint(1, 5)} hours. What is its "
        f"average speed over the whole trip?",
        f"Solve for x: {c}x + {a} = {c * b + a}. Show each step.",
        f"The sum of two numbers is {a + b}, and their difference is {abs(a - b)}. What are the numbers?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter? If both sides grow by "
        f"{c} cm, by how much does the area grow?",
        f"What is {a} percent of {b * 37}? Then what is that number squared?",
    ]
    return rng.choice(forms)


def reasoning_prompt(rng: random.Random) -> str:
    p = rng.sample(NAMES, 4)
    forms = [
        f"{p[0]} is taller than {p[1]}. {p[1]} is taller than {p[2]}. {p[3]} is shorter than {p[2]}. Who is the "
        f"tallest, and who is the shortest? Explain.",
        f"If it takes {rng.randint(3, 9)} machines {rng.randint(3, 9)} minutes to make that many widgets, how long "
        f"would it take {rng.randint(50, 200)} machines to make {rng.randint(50, 200)} widgets?",
        f"{p[0]}, {p[1]} and {p[2]} each own one pet: a cat, a dog or a fish. {p[0]} does not own the dog. {p[2]} "
        f"owns the fish. Who owns which pet?",
    ]
    return rng.choice(forms)


def chat_prompt(kind: str, topic: Topic, rng: random.Random) -> str | None:
    """A request of the given kind about a topic (None when the topic's text does not suit it)."""
    if kind == "writing":
        return f"Write {rng.choice(FORMS)} about {topic.name}, which is described as: {topic.text[:300]}"
    if kind == "roleplay":
        return (f"Pretend you are {rng.choice(ROLES)}. In character, tell a newcomer about {topic.name} "
                f"({topic.text[:200]}).")
    if kind == "stem":
        return f"What is {topic.name}? Explain how it works and when one would use it, with an example."
    if kind == "humanities":
        return (f"Discuss the history and the social impact of tools like {topic.name} ({topic.text[:160]}). "
                f"Give arguments for and against.")
    if kind == "summarize":
        return f"Summarize the following text in two or three sentences:\n\n{topic.text}" if len(topic.text) > 300 \
            else None
    if kind == "extract":
        return ("Extract every technical term, name and number from the following text and return them as a "
                f"JSON object with the keys \"terms\", \"names\" and \"numbers\":\n\n{topic.text}")
    if kind == "qa":
        return f"Read this description and answer: what problem does it solve, and for whom?\n\n{topic.text}"
    if kind == "translate":
        found = sentences(topic.text)
        return f"Translate into {rng.choice(LANGUAGES)}: {rng.choice(found)}" if found else None
    raise ValueError(f"unknown chat prompt kind {kind!r}")


CHAT_KINDS = ("writing", "roleplay", "stem", "humanities", "summarize", "extract", "qa", "translate", "math",
              "reasoning")


def chat_prompts(topics: list[Topic], n: int, rng: random.Random) -> list[tuple[str, str]]:
    """(id, prompt) of n single-turn chat requests, the kinds taken in turn, topics drawn by rng."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    kinds = iter(_cycle(CHAT_KINDS))
    tries = 0
    while len(out) < n and tries < 20 * n + 100:
        tries += 1
        kind = next(kinds)
        if kind in ("math", "reasoning"):
            text = math_prompt(rng) if kind == "math" else reasoning_prompt(rng)
            pid = f"chat:{kind}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"
        else:
            if not topics:
                continue
            topic = rng.choice(topics)
            text = chat_prompt(kind, topic, rng)
            pid = f"chat:{kind}:{topic.id}"
        if text is None or pid in seen or is_test_set(text):
            continue
        seen.add(pid)
        out.append((pid, text))
    return out


def _cycle(items) -> Iterator:
    while True:
        yield from items


def package_files(limit: int = 20000) -> list[Path]:
    """Sorted .py files of the standard library and this interpreter's installed packages (no tests, no
    test sets), at most ``limit``."""
    roots = {Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])}
    skip = {"test", "tests", "testing", "idlelib", "lib2to3", "__pycache__", "turtledemo", "ensurepip"}
    out: list[Path] = []
    for root in sorted(roots):
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).parts
            nested = "site-packages" in rel and root != Path(sysconfig.get_paths()["purelib"])  # another env's
            if nested or set(rel[:-1]) & skip or is_test_set(str(path)) or path.name.startswith("test_"):
                continue
            out.append(path)
    return out[:limit] if limit else out
