"""Training prompts in the client's forms (client_prompts.py): HumanEval's words, MT-Bench's kinds, no test set."""
from __future__ import annotations

import ast
import random

from edgespec.netem.bench.prompt_sets import HUMANEVAL_INSTRUCTION
from edgespec.server.training.client_prompts import (CHAT_KINDS, COMPLETE_INSTRUCTION, Topic, chat_prompts,
                                                     completion_prompts, completion_snippet, dpkg_topics,
                                                     docstring_topics)
from edgespec.server.training.corpus import is_test_set

SOURCE = '''
import math


@staticmethod
def hypotenuse(a: float, b: float) -> float:
    """Return the length of the hypotenuse of a right triangle.

    >>> hypotenuse(3, 4)
    5.0
    """
    return math.sqrt(a * a + b * b)


def humaneval_helper(x):
    """Runs the HumanEval checks on a candidate and returns the pass rate of the problem."""
    return x


def undocumented(x):
    return x
'''


def test_the_completion_instruction_is_the_benchmarks_own():
    assert COMPLETE_INSTRUCTION == HUMANEVAL_INSTRUCTION


def test_a_completion_snippet_is_the_header_and_docstring_without_the_body():
    tree = ast.parse(SOURCE)
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    snippet = completion_snippet(SOURCE, funcs["hypotenuse"])
    assert snippet.startswith("@staticmethod\ndef hypotenuse(a: float, b: float) -> float:\n")
    assert snippet.rstrip().endswith('"""') and "5.0" in snippet and "math.sqrt" not in snippet
    assert completion_snippet(SOURCE, funcs["undocumented"]) is None


def test_completion_prompts_skip_test_sets_and_are_reproducible(tmp_path):
    (tmp_path / "geo.py").write_text(SOURCE)
    (tmp_path / "more.py").write_text(SOURCE.replace("hypotenuse", "leg"))
    files = sorted(tmp_path.glob("*.py"))
    a = completion_prompts(files, 10, random.Random(3))
    assert a == completion_prompts(files, 10, random.Random(3))
    assert len(a) == 2 and all(p.startswith("Complete the following Python code.") for _, p in a)
    assert not any(is_test_set(p) for _, p in a)
    assert len({i for i, _ in a}) == len(a)


def test_chat_prompts_cover_every_kind_and_never_a_test_set():
    topics = [Topic(f"t:{i}", f"tool{i}", "A command-line tool that compresses files quickly. It supports many "
                    "formats and streams. Written in C for speed, it runs on every platform we know of. " * 3)
              for i in range(30)]
    topics.append(Topic("t:bad", "mt-bench", "The MT-Bench questions, with Spec-Bench and HumanEval beside them."))
    found = chat_prompts(topics, 60, random.Random(0))
    assert found == chat_prompts(topics, 60, random.Random(0))
    assert len(found) == 60 and len({i for i, _ in found}) == 60
    assert {i.split(":")[1] for i, _ in found} == set(CHAT_KINDS)
    assert not any(is_test_set(p) for _, p in found)


def test_ifbench_is_a_test_set_too():
    assert is_test_set("prompts from IFBench") and is_test_set("if_bench/data.jsonl")


def test_topics_from_package_descriptions_and_module_docstrings(tmp_path):
    status = tmp_path / "status"
    status.write_text("Package: zstd\nStatus: install ok installed\nDescription: fast lossless compression "
                      "algorithm -- CLI tool\n Zstandard compresses at high ratios.\n .\n It is fast.\n\n"
                      "Package: nodesc\nStatus: install ok installed\n")
    topics = dpkg_topics(status)
    assert [t.name for t in topics] == ["zstd"] and "high ratios" in topics[0].text
    mod = tmp_path / "widgets.py"
    mod.write_text('"""Widgets: small reusable pieces of a user interface, laid out in rows and columns."""\n')
    assert [t.name for t in docstring_topics([mod])] == ["widgets"]


def test_a_file_the_parser_gives_up_on_is_skipped(tmp_path):
    """Installed packages hold files CPython will not parse (nesting deep enough for MemoryError or RecursionError,
    and on 3.11 before 3.11.8 a SystemError): they are skipped like bad syntax, and the others still count."""
    deep = tmp_path / "deep.py"
    deep.write_text('"""A module whose one expression is nested far too deep for the parser."""\nx = ' + "-" * 300_000
                    + "1\n")
    (tmp_path / "geo.py").write_text(SOURCE)
    mod = tmp_path / "widgets.py"
    mod.write_text('"""Widgets: small reusable pieces of a user interface, laid out in rows and columns."""\n')
    files = sorted(tmp_path.glob("*.py"))
    assert len(completion_prompts(files, 10, random.Random(0))) == 1
    assert [t.name for t in docstring_topics(files)] == ["widgets"]
